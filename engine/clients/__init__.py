"""Clients for other inference servers (Qt-free; used by the benchmark and remote engines)."""

from engine.clients.streaming import APIS, Api, ClientError, StreamingClient, StreamResult

__all__ = ["APIS", "Api", "ClientError", "StreamResult", "StreamingClient"]
