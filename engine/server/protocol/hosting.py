"""The server's own routes: the model list, loading and unloading a model, /health."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from engine.server.body_model import Body
from engine.server.protocol.base import KeepAlive, Reply
from engine.server.protocol.transcription import SpeechToTextState


class LoadModelRequest(Body):
    """The optional body of /v1/models/{id}/load."""

    keep_alive: KeepAlive = None
    pinned: Annotated[
        bool | None, Field(description="true: never unloaded when idle or to make room")
    ] = None


class ModelCard(Reply):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    loaded: bool | None = None
    capabilities: Annotated[
        list[str] | None,
        Field(
            description="a loaded model's, as Ollama names them: completion, vision, audio, "
            "tools, thinking, embedding"
        ),
    ] = None
    meta: dict[str, Any] | None = None


class ModelList(Reply):
    object: str
    data: list[ModelCard]


class HostedModelState(Reply):
    """A model as the host holds it: loaded or not, why it stays, when it goes."""

    id: str
    loaded: bool
    state: str | None = None  # loading | ready
    pinned: bool | None = None
    held_by: str | None = None  # the client that loaded it and keeps it (the app's chat)
    requests_in_flight: int | None = None
    keep_alive_s: float | None = None
    expires_in_s: float | None = None
    memory_bytes: dict[str, int] | None = None


class Health(Reply):
    status: str
    error: str | None = None
    models: list[dict[str, Any]] | None = None
    loading: list[str] | None = None
    model: str | None = None
    slots_total: int | None = None
    slots_busy: int | None = None
    queue_depth: int | None = None
    settings: dict[str, Any] | None = None
    speech_to_text: SpeechToTextState | None = None  # serve --stt-model's
