"""Clients for other inference servers (Qt-free; used by the benchmark and remote engines)."""

from engine.clients.streaming import (
    APIS,
    Api,
    ChatStream,
    ClientError,
    ErrorKind,
    RequestError,
    StreamingClient,
    StreamResult,
)

__all__ = ["APIS", "Api", "ChatStream", "ClientError", "ErrorKind", "RequestError",
           "StreamResult", "StreamingClient"]
