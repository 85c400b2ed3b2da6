"""PySide6 only here: windows, widgets, Qt item models, the engine worker thread."""
