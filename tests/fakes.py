"""A model for the app's engine thread that needs no llama.cpp and no GGUF file: it "loads"
at once (or when a test lets it) and answers with scripted text.

`FakeModels` is a `ModelFactory` for `EngineWorker(model_factory=...)`. What it makes passes
for an `engine.host.runtime.Model` where the worker and `EmbeddedEngine` use one (a real chat
template renders the prompt; one token per byte), so everything above the decode loop runs
as it does with a real model: the reply's request ids, coalescing, thinking blocks, tool
calls parsed from the text, stats.

    models = FakeModels(FakeReply(["Hello", " there"]))
    worker = EngineWorker(models, token_interval_s=0)  # every piece its own signal
    models.reply = FakeReply(["Bye"], fail_after=1)     # what the next replies say
    models.next_replies.append(FakeReply(hold_after=1))  # one reply, before `reply`
    models.hold_loads(); ...; models.release_loads()    # a load that waits for the test
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from engine.errors import EngineError, LoadCancelled
from engine.host.model_build import LoadInfo
from engine.host.runtime import Model
from engine.host.stats import GenerationStats
from engine.model.gguf import GGUFFile
from engine.model.templates import ChatTemplate
from engine.settings import LoadParams, SamplingParams

_POLL_S = 0.002  # how often a held load or reply looks at its cancel flag


@dataclass
class FakeReply:
    """One scripted answer. `tokens`: its text, piece by piece (each piece one generated
    token); `delay_s`: before each piece; `fail_after`: raise `error` (an EngineError) once
    that many pieces are out; `hold_after`: once that many pieces are out, wait until
    `release()` (or Stop) before the rest; `prompt_tokens`: what the reply says its prompt
    took (None: the rendered prompt's length)."""

    tokens: Sequence[str] = ("Hello", ",", " world", ".")
    delay_s: float = 0.0
    fail_after: int | None = None
    error: str = "the fake engine failed"
    hold_after: int | None = None
    prompt_tokens: int | None = None
    released: threading.Event = field(default_factory=threading.Event, repr=False)

    def release(self) -> None:
        self.released.set()


class FakeGeneration:
    """What `Model.submit` returns, read by `EmbeddedReply`: iterate for the pieces."""

    def __init__(
        self,
        script: FakeReply,
        prompt: list[int],
        sampling: SamplingParams,
        cancel: threading.Event | None,
    ) -> None:
        n = script.prompt_tokens
        self.prompt = prompt if n is None else [0] * n
        self.sampling = sampling
        self.cancel = cancel or threading.Event()
        self.script = script
        self.text = ""
        self.tokens: list[int] = []
        self.stats = GenerationStats(prompt_tokens=len(self.prompt))

    def __iter__(self) -> Iterator[str]:
        t0 = time.perf_counter()
        s = self.script
        pieces = list(s.tokens)[: max(self.sampling.max_tokens, 0)]
        self.stats.stop_reason = "length" if len(pieces) < len(s.tokens) else "stop"
        for i, piece in enumerate(pieces):
            if s.fail_after is not None and i >= s.fail_after:
                raise EngineError(s.error)
            if s.hold_after is not None and i == s.hold_after:
                while not s.released.wait(_POLL_S) and not self.cancel.is_set():
                    pass
            if s.delay_s:
                self.cancel.wait(s.delay_s)
            if self.cancel.is_set():
                self.stats.stop_reason = "cancelled"
                break
            self.tokens.append(i)
            self.text += piece
            if i == 0:
                self.stats.ttft_s = time.perf_counter() - t0
            yield piece
        if s.fail_after is not None and self.stats.stop_reason != "cancelled":
            raise EngineError(s.error)  # after every piece
        self.stats.gen_tokens = len(self.tokens)
        self.stats.total_s = time.perf_counter() - t0


class FakeModel:
    """The parts of `Model` the engine thread and `EmbeddedEngine` use."""

    def __init__(self, path: Path, params: LoadParams, models: FakeModels) -> None:
        self.path = Path(path)
        self.params = params
        self._models = models
        self.n_ctx_seq = params.n_ctx
        self.gguf = GGUFFile(
            source_name=self.path.name,
            version=3,
            metadata={
                "general.architecture": "llama",
                "general.name": models.name or self.path.stem,
                "llama.block_count": 2,
                "llama.context_length": params.n_ctx,
            },
            tensors=[],
            data_offset=0,
            file_size=0,
        )
        self.template = ChatTemplate(models.template)
        self.load_info = LoadInfo(
            path=str(self.path),
            load_s=0.0,
            n_ctx=params.n_ctx,
            n_gpu_layers=0,
            n_layer=2,
            n_threads=1,
        )
        self.repeat_caveat = ""
        self.closed = False

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        return list(text.encode())

    def special_token(self, text: str) -> int | None:
        return None

    def render_chat(self, messages: Sequence[Mapping[str, Any]], **extra: Any) -> str:
        return self.template.render(messages, add_generation_prompt=True, **extra)

    def chat_prompt_tokens(self, text: str) -> list[int]:
        return self.tokenize(text)

    def submit(
        self,
        prompt: list[int],
        sampling: SamplingParams | None = None,
        *,
        cancel: threading.Event | None = None,
        **_: Any,
    ) -> FakeGeneration:
        models = self._models
        script = models.next_replies.pop(0) if models.next_replies else models.reply
        models.prompts.append(prompt)
        return FakeGeneration(script, prompt, sampling or SamplingParams(), cancel)

    def close(self) -> None:
        self.closed = True


class FakeModels:
    """A `ModelFactory`: every load makes a `FakeModel` answering with `reply` (or the
    replies queued in `next_replies` first). `load_error`: loads fail with it; `name`: the
    model's name (default: the file's stem); `template`: its chat template's source (None:
    the ChatML fallback; one with think markers makes a reasoning model)."""

    def __init__(
        self,
        reply: FakeReply | None = None,
        *,
        load_error: str | None = None,
        name: str = "",
        template: str | None = None,
    ) -> None:
        self.reply = reply or FakeReply()
        self.next_replies: list[FakeReply] = []
        self.load_error = load_error
        self.name = name
        self.template = template
        self.loads: list[Path] = []  # every load asked for, in order
        self.prompts: list[list[int]] = []  # every reply's prompt tokens
        self._gate: threading.Event | None = None

    def hold_loads(self) -> None:
        """Loads from now on wait (cancellable) until `release_loads`."""
        self._gate = threading.Event()

    def release_loads(self) -> None:
        if self._gate is not None:
            self._gate.set()
        self._gate = None

    def __call__(
        self,
        path: Path,
        params: LoadParams,
        *,
        progress: Callable[[float], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> Model:
        self.loads.append(Path(path))
        if progress is not None:
            progress(0.0)
        gate = self._gate
        while gate is not None and not gate.wait(_POLL_S):
            if cancel is not None and cancel.is_set():
                break
        if cancel is not None and cancel.is_set():
            raise LoadCancelled("loading cancelled")
        if self.load_error is not None:
            raise EngineError(self.load_error)
        if progress is not None:
            progress(1.0)
        return cast(Model, FakeModel(path, params, self))


__all__ = ["FakeGeneration", "FakeModel", "FakeModels", "FakeReply"]
