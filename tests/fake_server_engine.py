"""A model without weights for the HTTP server's tests: the real routes, request validation,
host, `ServedModel` and decode loop over a fake context whose model answers from a script.

The seam is the model the host hands out. `FakeModel` has what the routes and
`engine.host.chat_plan` read of a `Model` (its chat template, a tokenizer, its limits) and
what the loop reads (`tests/fake_backend.py`: a `FakeBackend` context), so its loop is the
real `Scheduler`: admission, the queue, slots, max_tokens, stop strings and cancellation are
the server's own. Its model writes the reply scripted for the prompt one word-token at a
time, then the end-of-generation token. So everything from the socket to the events is the
server's own code, and a test can read back the prompt and sampling each request arrived
with.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from engine.decoding.constraints import TokenMask
from engine.errors import EngineError
from engine.host.requests import EventCallback, Request
from engine.host.runtime import Model
from engine.host.scheduler import Scheduler
from engine.model.templates import ChatTemplate
from engine.server import ServedModel, ServerConfig, ServerState, ServerThread
from engine.settings import SamplingParams
from tests.fake_backend import EOG, FakeLoopModel, FakeVocab

DEFAULT_REPLY = "Hello from the fake model."
# High enough that any sampling the API allows writes the scripted token.
SCRIPT_LOGIT = 60.0


@dataclass(frozen=True)
class Seen:
    """One request as it reached the decode loop."""

    prompt: str  # the prompt's tokens read back as text (the rendered chat template)
    sampling: SamplingParams
    stream: bool


class AnyToken:
    """The grammar of a forced call, as the fake applies it: the script is what the model
    writes, so nothing is masked (grammars are tested on SmolLM2)."""

    complete = False
    error: str | None = None

    def apply(self, logits: npt.NDArray[np.float32]) -> None:
        return None

    def consume(self, token: int) -> bool:
        return True


class ScriptedLoop(Scheduler):
    """The real decode loop; `submit` first tells the model which reply the prompt gets
    (taken back if the loop refuses the request)."""

    model: FakeModel

    def submit(  # type: ignore[override]
        self, prompt: list[int], sampling: SamplingParams, on_event: EventCallback, **kw: Any
    ) -> Request:
        undo = self.model.assign(prompt, sampling, bool(kw.get("stream", True)))
        try:
            return super().submit(prompt, sampling, on_event, **kw)
        except BaseException:
            undo()
            raise


class FakeModel(FakeLoopModel):
    """What the server reads of a loaded `Model`, without llama.cpp. `path` must be a file
    (the routes show its size, date and digest); its content is not read."""

    embedding_only = False
    flash_attn_on = False
    gguf = None  # no file facts: /api/show and `details` say so

    def __init__(
        self, path: Path, *, n_slots: int = 2, n_ctx_seq: int = 512, template: str | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._replies: deque[str] = deque()
        self._assigned: dict[tuple[int, ...], list[int]] = {}
        self.seen: list[Seen] = []
        super().__init__(
            n_slots=n_slots,
            n_ctx_seq=n_ctx_seq,
            n_batch=512,
            vocab=FakeVocab("", capacity=1 << 14),
            next_token=self._next_token_of,
            chosen_logit=SCRIPT_LOGIT,
        )
        self.path = path
        # The ChatML fallback unless a test gives the template (e.g. one with a thinking block).
        self.template = ChatTemplate(template, eos_token="<|im_end|>")
        self.scheduler = ScriptedLoop(self)

    # -- the script ------------------------------------------------------------------------

    def script(self, *replies: str) -> None:
        """The next requests' replies, in order; once they are used up, DEFAULT_REPLY."""
        with self._lock:
            self._replies.extend(replies)

    def assign(
        self, prompt: list[int], sampling: SamplingParams, stream: bool
    ) -> Callable[[], None]:
        """Give `prompt` the next scripted reply; returns what takes that back. (The model
        reads only the cells, so the same prompt twice in flight gets the later reply.)"""
        with self._lock:
            text = self._replies.popleft() if self._replies else None
            key = tuple(prompt)
            before = self._assigned.get(key)
            self._assigned[key] = self.vocab.tokenize(DEFAULT_REPLY if text is None else text)
            seen = Seen(self.detokenize(prompt), sampling, stream)
            self.seen.append(seen)

        def undo() -> None:
            with self._lock:
                self.seen.remove(seen)
                if text is not None:
                    self._replies.appendleft(text)
                if before is None:
                    self._assigned.pop(key, None)
                else:
                    self._assigned[key] = before

        return undo

    def _next_token_of(self, history: Sequence[int]) -> int:
        """The model: after a prompt (the longest one assigned that `history` starts with),
        its reply's next token, then the end of generation."""
        with self._lock:
            best: tuple[int, list[int]] | None = None
            for prompt, reply in self._assigned.items():
                n = len(prompt)
                if (best is None or n > best[0]) and tuple(history[:n]) == prompt:
                    best = (n, reply)
        if best is None:
            return EOG
        n, reply = best
        k = len(history) - n
        return reply[k] if k < len(reply) else EOG

    def reset(self) -> None:
        with self._lock:
            self._replies.clear()
            self._assigned.clear()
            self.seen.clear()

    # -- what the routes call --------------------------------------------------------------

    @property
    def loop(self) -> Scheduler:
        if self.scheduler is None or self.scheduler.closed:
            raise EngineError(f"{self.path.name} has been unloaded")
        return self.scheduler

    @property
    def n_ctx(self) -> int:
        return self.params.n_ctx

    @property
    def n_ctx_seq(self) -> int:
        return self.params.n_ctx // max(self.params.n_seq_max, 1)

    @property
    def n_vocab(self) -> int:
        return self.vocab.capacity

    def grammar_mask(self, grammar: str) -> TokenMask:
        return cast(TokenMask, AnyToken())

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        return self.vocab.tokenize(text)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.vocab.detokenize(tokens)

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        return self.vocab.piece(token, special)

    def special_token(self, text: str) -> int | None:
        return None  # no control tokens: tool formats write their markers as text

    def render_chat(self, messages: Sequence[Mapping[str, Any]], **extra: Any) -> str:
        return self.template.render(messages, add_generation_prompt=True, **extra)

    def chat_prompt_tokens(self, text: str) -> list[int]:
        return self.tokenize(text)

    def chat_tokens(self, messages: Sequence[Mapping[str, Any]], **extra: Any) -> list[int]:
        return self.chat_prompt_tokens(self.render_chat(messages, **extra))


@contextlib.contextmanager
def fake_model(folder: Path) -> Iterator[FakeModel]:
    """A `FakeModel` over a stub file in `folder` (2 slots of 512 tokens), closed after."""
    path = folder / "fake-135m-q4.gguf"
    path.write_bytes(b"GGUF" + bytes(252))
    model = FakeModel(path, n_slots=2, n_ctx_seq=512)
    try:
        yield model
    finally:
        model.close()


@contextlib.contextmanager
def serve_fake(model: FakeModel, config: ServerConfig) -> Iterator[ServerThread]:
    """The real server on a free port serving `model` as `config.model_id`, the way
    `candlewick serve` serves a model it loaded (`ServerState.set_loaded`)."""
    # The seam: the server takes the fake wherever it takes a `Model`.
    loaded = ServedModel.build(
        cast(Model, model), config.model_id, max_queue=config.max_queue, embeddings=False
    )
    state = ServerState(config)
    state.set_loaded(loaded)
    try:
        with ServerThread(state) as srv:
            yield srv
    finally:
        state.set_loaded(None)
        loaded.close()
        state.close()


__all__ = ["DEFAULT_REPLY", "FakeModel", "ScriptedLoop", "Seen", "serve_fake"]
