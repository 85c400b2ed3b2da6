"""One interface for whatever answers a chat: the embedded llama.cpp runtime or a remote server.

The desktop worker, the chat controller and the performance panel talk to a `ChatEngine` and
read a `ReplyStream`; they never need to know which kind of engine is behind it:

    engine.name, engine.kind ("embedded"|"remote"), engine.n_ctx (None: remote),
    engine.can_continue, engine.close()
    engine.reply(messages, sampling, cancel, continue_text="", policy=None) -> ReplyStream
    for piece in stream: ...             # text pieces as they arrive
    stream.prompt_tokens                 # int, or None while (or when) unknown
    stream.generated_tokens              # running count
    stream.dropped_messages              # old messages left out to fit the context
    stream.stats                         # GenerationStats, complete once iteration ends

Errors are `EngineError`s (remote ones are `engine.remote.RemoteError` subclasses, which keep
the partial answer). `reply()` may raise before any text (a context that cannot hold the
conversation, an unknown template); iteration may raise part-way.

`EmbeddedEngine` adapts `engine.host.runtime.Model`: its replies are requests to the model's
one decode loop, marked interactive so that they go before queued API requests. It fits the
conversation to a slot's context with the chosen policy and continues a cut-off answer by
ending the prompt with it. A remote engine does no fitting: the server owns its context.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from engine.errors import EngineError
from engine.host.context_policy import ContextPolicy, fit_messages
from engine.host.generation import Generation
from engine.host.runtime import Model
from engine.host.stats import GenerationStats
from engine.settings import SamplingParams

EngineKind = Literal["embedded", "remote"]
Messages = Sequence[Mapping[str, Any]]


@runtime_checkable
class ReplyStream(Protocol):
    """An answer being produced. Iterate for text pieces; `stats` is final after the loop."""

    @property
    def prompt_tokens(self) -> int | None:
        """Tokens in the prompt as sent; None when not (yet) known (a remote server that
        reports no usage, or before its usage report arrives at the end of the stream)."""

    @property
    def generated_tokens(self) -> int:
        """Tokens generated so far (remote without usage: chunks received)."""

    @property
    def dropped_messages(self) -> int:
        """Old messages left out so the conversation fits the context (embedded only)."""

    @property
    def text(self) -> str:
        """The answer so far."""

    @property
    def stats(self) -> GenerationStats:
        """Figures for this reply; complete once iteration has ended."""

    def __iter__(self) -> Iterator[str]: ...


@runtime_checkable
class ChatEngine(Protocol):
    """Something that answers chats: a loaded local model or a remote endpoint."""

    @property
    def name(self) -> str:
        """What to call it in the window: a model name, or "connection · model"."""

    @property
    def kind(self) -> EngineKind: ...

    @property
    def n_ctx(self) -> int | None:
        """Context length in tokens; None when the engine does not say (remote)."""

    @property
    def can_continue(self) -> bool:
        """Whether `reply(continue_text=...)` works (remote chat APIs cannot continue an
        assistant message portably)."""

    def reply(self, messages: Messages, sampling: SamplingParams,
              cancel: threading.Event | None = None, *, continue_text: str = "",
              policy: ContextPolicy | None = None) -> ReplyStream:
        """Start an answer. `continue_text`: a cut-off answer to continue (the reply holds
        only the new text). `policy`: how to fit a conversation that outgrows the context
        (embedded engines; None = send as is)."""

    def close(self) -> None:
        """Free what the engine holds (the model, or nothing for a remote engine)."""


class EmbeddedReply:
    """A `ReplyStream` over `engine.host.runtime.Generation`."""

    def __init__(self, gen: Generation, dropped: int = 0) -> None:
        self.generation = gen
        self._dropped = dropped

    @property
    def prompt_tokens(self) -> int:
        return len(self.generation.prompt)

    @property
    def generated_tokens(self) -> int:
        return len(self.generation.tokens)

    @property
    def dropped_messages(self) -> int:
        return self._dropped

    @property
    def text(self) -> str:
        return self.generation.text

    @property
    def stats(self) -> GenerationStats:
        return self.generation.stats

    def __iter__(self) -> Iterator[str]:
        return iter(self.generation)


class EmbeddedEngine:
    """The `ChatEngine` for a model loaded in this process. It owns the model: `close()`
    frees it."""

    kind: EngineKind = "embedded"
    can_continue: bool = True

    def __init__(self, model: Model, name: str | None = None) -> None:
        self.model = model
        self._closed = False
        self.name = name or str(model.gguf.metadata.get("general.name") or model.path.stem)

    @property
    def n_ctx(self) -> int:
        """What one conversation may hold: a slot of the model's context."""
        return self.model.n_ctx_seq

    def reply(self, messages: Messages, sampling: SamplingParams,
              cancel: threading.Event | None = None, *, continue_text: str = "",
              policy: ContextPolicy | None = None) -> EmbeddedReply:
        if self._closed:
            raise EngineError("the model has been unloaded; load it again")
        model = self.model
        dropped = 0
        if policy is not None:
            extra = (len(model.tokenize(continue_text, add_special=False))
                     if continue_text else 0)
            fit = fit_messages(messages, lambda ms: len(model.chat_tokens(ms)) + extra,
                               model.n_ctx_seq,
                               reserve=min(sampling.max_tokens, model.n_ctx_seq // 2),
                               policy=policy)
            messages, dropped = fit.messages, fit.dropped
        if continue_text:
            prompt = model.chat_tokens(messages) + model.tokenize(
                continue_text, add_special=False, parse_special=False)
            gen = model.submit(prompt, sampling, cancel=cancel)
        else:
            gen = model.generate(messages, sampling, cancel=cancel)
        return EmbeddedReply(gen, dropped)

    def close(self) -> None:
        self._closed = True  # llama.cpp crashes on a freed model: refuse before reaching it
        self.model.close()
