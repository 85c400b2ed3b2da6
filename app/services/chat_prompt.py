"""What a chat's reply asks the engine, built from the messages on screen and the chat's
settings: the history for the model (one system message: the chat's prompt, then a grounded
answer's passages), the attachments its markers stand for, and the sampling with the
structured output's grammar (compiled once per schema).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from app.services.attachments import Attachment
from app.services.chat_ports import EngineInfo, MediaFile
from app.services.chat_settings import ChatSettings
from app.services.chat_transcript import Transcript
from app.services.conversation import Conversation, Message
from engine.decoding import constraints
from engine.host.context_meter import Kind
from engine.rag.grounding import Grounding
from engine.settings import SamplingParams


class PromptBuilder:
    def __init__(
        self,
        chat: Transcript,
        data: Callable[[Attachment], bytes | None],
        marker: Callable[[], str],
    ) -> None:
        """`data`: a sent attachment's bytes (None: its file is gone); `marker`: what stands
        for one attachment in a message's text."""
        self.chat = chat
        self._data = data
        self._marker = marker
        self._compiled: tuple[str, str] | None = None  # (schema as JSON, its grammar)

    # -- sampling ----------------------------------------------------------------------------

    @staticmethod
    def free_sampling(base: SamplingParams, settings: ChatSettings) -> SamplingParams:
        """The chat's sampling without its structured-output grammar."""
        return settings.sampling_over(base)

    def sampling(self, base: SamplingParams, settings: ChatSettings) -> SamplingParams:
        """The chat's sampling; with a structured-output schema, its grammar (GrammarError
        when the schema cannot be used: one stored before this check, or by an import)."""
        sampling = self.free_sampling(base, settings)
        schema = settings.schema
        if schema is None:
            return sampling
        return dataclasses.replace(sampling, grammar=self._grammar(schema))

    def _grammar(self, schema: dict[str, Any]) -> str:
        key = json.dumps(schema, sort_keys=True)
        if self._compiled is None or self._compiled[0] != key:
            self._compiled = (key, constraints.json_schema(schema))
        return self._compiled[1]

    @staticmethod
    def stored_sampling(sampling: SamplingParams, settings: ChatSettings) -> dict[str, Any]:
        """What a stored answer records of its sampling: the schema it followed, not the
        compiled grammar."""
        out = dataclasses.asdict(sampling)
        out.pop("grammar", None)
        if settings.schema is not None:
            out["json_schema"] = settings.schema
        return out

    # -- the history ----------------------------------------------------------------------------

    def messages(
        self,
        settings: ChatSettings,
        loaded: EngineInfo | None,
        upto: int | None = None,
        grounding: Grounding | None = None,
    ) -> list[dict[str, Any]]:
        """The history for the model; a grounded answer's passages go in the system message,
        after the chat's own system prompt (one system message: many templates take no
        second one)."""
        conv = Conversation(self.chat.conversation.messages[:upto])
        if self._sends_media(loaded):
            msgs = conv.for_model(self._marker(), lambda a: self._sends(loaded, a))
        else:
            msgs = conv.for_model()
        system = self._system(settings, grounding)
        return ([{"role": "system", "content": system}] if system else []) + msgs

    @staticmethod
    def _system(settings: ChatSettings, grounding: Grounding | None) -> str:
        system = settings.system_prompt.strip()
        if grounding is not None and grounding.text:
            system = f"{system}\n\n{grounding.text}" if system else grounding.text
        return system

    def sources(
        self, settings: ChatSettings, upto: int | None = None, grounding: Grounding | None = None
    ) -> list[str | None]:
        """For each message of `messages(...)`, the id of the message on screen it comes
        from (None: the system message). The same turns as `Conversation.for_model` keeps."""
        head: list[str | None] = [None] if self._system(settings, grounding) else []
        return head + [m.id for m in self.chat.conversation.messages[:upto] if _sent(m)]

    @staticmethod
    def meter_tags(
        settings: ChatSettings, grounding: Grounding | None
    ) -> tuple[dict[int, Kind], dict[int, tuple[Kind, str]]]:
        """What the context meter calls the system message: the chat's prompt, then the
        passages found (appended to it: one system message), or the passages alone."""
        if grounding is None or not grounding.text:
            return {}, {}
        if not settings.system_prompt.strip():
            return {0: "documents"}, {}
        return {}, {0: ("documents", grounding.text)}

    def media(self, loaded: EngineInfo | None, upto: int | None = None) -> list[MediaFile]:
        """The files the markers of `messages(..., upto)` stand for, in order."""
        if not self._sends_media(loaded):
            return []
        conv = Conversation(self.chat.conversation.messages[:upto])
        return [
            (a.kind, self._data(a) or b"", a.name)
            for a in conv.media_for_model(lambda a: self._sends(loaded, a))
        ]

    @staticmethod
    def _sends_media(info: EngineInfo | None) -> bool:
        return info is not None and info.remote is None and bool(info.media)

    def _sends(self, info: EngineInfo | None, a: Attachment) -> bool:
        """An attachment goes to the model: of a kind it reads, its file still there."""
        return info is not None and a.kind in info.media and self._data(a) is not None


def _sent(m: Message) -> bool:
    """Whether `Conversation.for_model` sends the message: finished turns, tool results
    that came back, answers with text or calls."""
    if m.role == "tool":
        return m.tool_status != "running"
    if m.state in ("error", "streaming"):
        return False
    return (
        bool(m.tool_calls)
        if m.role == "assistant" and m.tool_calls
        else (bool(m.text) or m.role != "assistant")
    )


__all__ = ["PromptBuilder"]
