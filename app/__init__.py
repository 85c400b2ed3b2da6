"""The Candlewick desktop application, its services and its command line."""
