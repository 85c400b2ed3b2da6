"""The local inference server: OpenAI- and Ollama-compatible HTTP API over the scheduler."""

from engine.server.app import create_app
from engine.server.config import ServerConfig, ServerError, is_loopback
from engine.server.engine_state import ServedModel, ServerState
from engine.server.runner import ServerThread, serve_forever

__all__ = [
    "ServedModel",
    "ServerConfig",
    "ServerError",
    "ServerState",
    "ServerThread",
    "create_app",
    "is_loopback",
    "serve_forever",
]
