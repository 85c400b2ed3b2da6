"""Server settings and the security rules that are checked before anything binds a socket."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from engine.errors import EngineError


class ServerError(EngineError):
    """A server setting that cannot work or is unsafe; `str()` is a one-line message."""


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to anything


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    model_id: str = "default"
    max_queue: int = 64  # requests waiting for a slot before new ones get 429
    max_body_bytes: int = 32 << 20  # 32 MiB, as Anthropic's API: room for images and audio
    max_tokens_cap: int = 4096  # no request generates more than this
    default_max_tokens: int = 512
    request_timeout_s: float = 600.0
    embeddings: bool = True  # /v1/embeddings and /api/embed (False: 501)
    webui_dir: str | None = None  # a built web UI served at / (engine.server.webui)
    # Where /slots/{id}?action=save|restore keep slot files (None: those actions are a 501,
    # as llama-server's without --slot-save-path).
    slot_save_path: Path | None = None
    spm_infill: bool = False  # /infill puts the suffix before the prefix (llama-server's)
    # The thinking's tokens at most, unless a request sets its own (llama-server's
    # --reasoning-budget): -1 no limit, 0 no thinking.
    reasoning_budget: int = -1
    # The whisper.cpp model /v1/audio/transcriptions and /translations use (serve --stt-model),
    # loaded on the first request; None: those routes answer 400.
    stt_model: Path | None = None

    def validate(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ServerError(f"port {self.port} is out of range (0-65535)")
        if self.api_key is not None:
            if len(self.api_key) < 8:
                raise ServerError("the API key is too short (at least 8 characters)")
            if any(c.isspace() for c in self.api_key) or not self.api_key.isprintable():
                raise ServerError("the API key must not contain spaces or control characters")
        if not is_loopback(self.host) and not self.api_key:
            raise ServerError(
                f"refusing to listen on {self.host} without an API key: anyone on the network "
                "could use the model; pass --api-key/--api-key-file or bind 127.0.0.1"
            )
        if "*" in self.cors_origins and not self.api_key:
            raise ServerError(
                "CORS origin '*' lets any web page use the server; "
                "set an API key or name the origins"
            )
        if self.max_tokens_cap < 1 or self.default_max_tokens < 1:
            raise ServerError("token limits must be at least 1")
        if self.max_body_bytes < 1024:
            raise ServerError("the request body limit must be at least 1024 bytes")
        if self.request_timeout_s <= 0:
            raise ServerError("the request timeout must be positive")
        if self.reasoning_budget < -1:
            raise ServerError("the reasoning budget must be -1 (no limit), 0 or more")
        if self.max_queue < 0:
            raise ServerError("the queue size must be 0 or more")
        if self.webui_dir is not None and not (Path(self.webui_dir) / "index.html").is_file():
            raise ServerError(
                f"--webui {self.webui_dir}: no index.html there; give the folder a web UI "
                "was built to (docs/server.md, llama-server's web UI)"
            )
