"""A model without weights for the HTTP server's tests: the real routes, request validation,
host and `ServedModel` over a fake `Model` whose decode loop answers from a script.

The seam is the model the host hands out. `FakeModel` has what the routes and
`engine.host.chat_plan` read of a `Model` (its chat template, a tokenizer, its limits) and a
`FakeLoop` in place of the scheduler: `submit` takes the real `Request`, and the loop's own
thread hands out the scripted reply one word-token at a time as `Started`/`Piece`/`Finished`
events, with max_tokens and stop strings applied as the real loop applies them (through
`engine.decoding.textstream`). So everything from the socket to the events is the server's
own code, and a test can read back the prompt and sampling each request arrived with.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from engine.decoding.textstream import TextStream
from engine.errors import EngineError
from engine.host.requests import (
    EventCallback,
    Finished,
    Piece,
    QueueFull,
    Request,
    SchedulerClosed,
    SchedulerSnapshot,
    Started,
)
from engine.host.runtime import Model
from engine.host.stats import GenerationStats, StopReason
from engine.model.templates import ChatTemplate
from engine.server import ServedModel, ServerConfig, ServerState, ServerThread
from engine.settings import LoadParams, SamplingParams

DEFAULT_REPLY = "Hello from the fake model."
# A token is a word with the whitespace before it, as BPE vocabularies cut most text.
_TOKEN = re.compile(r"\s*\S+|\s+")


@dataclass(frozen=True)
class Seen:
    """One request as it reached the decode loop."""

    prompt: str  # the prompt's tokens read back as text (the rendered chat template)
    sampling: SamplingParams
    stream: bool


class FakeModel:
    """What the server reads of a loaded `Model`, without llama.cpp. `path` must be a file
    (the routes show its size, date and digest); its content is not read."""

    embedding_only = False
    flash_attn_on = False
    speculator = None
    gguf = None  # no file facts: /api/show and `details` say so
    load_info = None
    memory_actual = None

    def __init__(
        self, path: Path, *, n_slots: int = 2, n_ctx_seq: int = 512, template: str | None = None
    ) -> None:
        self.path = path
        self.params = LoadParams(n_ctx=n_slots * n_ctx_seq, n_seq_max=n_slots)
        self.n_ctx = n_slots * n_ctx_seq
        self.n_ctx_seq = n_ctx_seq
        self.n_vocab = 1 << 20
        # The ChatML fallback unless a test gives the template (e.g. one with a thinking block).
        self.template = ChatTemplate(template, eos_token="<|im_end|>")
        self._lock = threading.Lock()
        self._vocab: dict[str, int] = {}
        self._words: list[str] = []
        self._replies: deque[str] = deque()
        self.seen: list[Seen] = []
        self.scheduler: FakeLoop | None = FakeLoop(self, n_slots, n_ctx_seq)

    # -- the script ------------------------------------------------------------------------

    def script(self, *replies: str) -> None:
        """The next requests' replies, in order; once they are used up, DEFAULT_REPLY."""
        with self._lock:
            self._replies.extend(replies)

    def next_reply(self, prompt: list[int], sampling: SamplingParams, stream: bool) -> str:
        with self._lock:
            self.seen.append(Seen(self.detokenize(prompt), sampling, stream))
            return self._replies.popleft() if self._replies else DEFAULT_REPLY

    def reset(self) -> None:
        with self._lock:
            self._replies.clear()
            self.seen.clear()

    # -- what the routes call --------------------------------------------------------------

    @property
    def loop(self) -> FakeLoop:
        if self.scheduler is None or self.scheduler.closed:
            raise EngineError(f"{self.path.name} has been unloaded")
        return self.scheduler

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        with self._lock:
            out = []
            for word in _TOKEN.findall(text):
                if word not in self._vocab:
                    self._vocab[word] = len(self._words)
                    self._words.append(word)
                out.append(self._vocab[word])
            return out

    def detokenize(self, tokens: Sequence[int]) -> str:
        return "".join(self._words[t] for t in tokens)

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        return self._words[token].encode()

    def special_token(self, text: str) -> int | None:
        return None  # no control tokens: tool formats write their markers as text

    def render_chat(self, messages: Sequence[Mapping[str, Any]], **extra: Any) -> str:
        return self.template.render(messages, add_generation_prompt=True, **extra)

    def chat_prompt_tokens(self, text: str) -> list[int]:
        return self.tokenize(text)

    def chat_tokens(self, messages: Sequence[Mapping[str, Any]], **extra: Any) -> list[int]:
        return self.chat_prompt_tokens(self.render_chat(messages, **extra))

    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()


class FakeLoop:
    """The scheduler's face to the server: `submit` queues a real `Request`; one thread
    (like the decode thread) answers the requests in turn from the model's script."""

    def __init__(self, model: FakeModel, n_slots: int, n_ctx_seq: int) -> None:
        self.model = model
        self.n_slots = n_slots
        self.n_ctx_seq = n_ctx_seq
        self.max_queue = 64
        self.reserved_slots = 0
        self.leased_by: str | None = None  # nobody holds its slots (the Local server would)
        self._cond = threading.Condition()
        self._queue: deque[Request] = deque()
        self._busy: Request | None = None
        self._next_id = 0
        self._generated = 0
        self._prompt_tokens = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="fake-decode", daemon=True)
        self._thread.start()

    @property
    def closed(self) -> bool:
        return self._stop

    def submit(
        self,
        prompt: list[int],
        sampling: SamplingParams,
        on_event: EventCallback,
        *,
        stream: bool = True,
        timeout_s: float | None = None,
        cancel: threading.Event | None = None,
        interactive: bool = False,
        **_: object,
    ) -> Request:
        """The real loop's checks before a request is queued, then the queue."""
        sampling.validate()
        if not prompt:
            raise EngineError("the prompt is empty")
        if len(prompt) >= self.n_ctx_seq:
            raise EngineError(
                f"the prompt is {len(prompt)} tokens, the context holds {self.n_ctx_seq}; "
                "shorten the conversation or load the model with a larger context"
            )
        with self._cond:
            if self._stop:
                raise SchedulerClosed("the model is being unloaded")
            if len(self._queue) >= self.max_queue + self.n_slots:
                raise QueueFull(f"all {self.n_slots} slots are busy")
            self._next_id += 1
            deadline = time.perf_counter() + timeout_s if timeout_s else None
            req = Request(
                self._next_id,
                list(prompt),
                sampling,
                on_event,
                stream=stream,
                deadline=deadline,
                wake=self._wake,
                cancel=cancel,
                interactive=interactive,
                spec=None,
                canonical=False,
            )
            self._queue.append(req)
            self._cond.notify()
        return req

    def snapshot(self) -> SchedulerSnapshot:
        with self._cond:
            busy = self._busy
            slots = [
                {
                    "id": i,
                    "busy": i == 0 and busy is not None,
                    "cached_tokens": 0,
                    "request": busy.id if i == 0 and busy is not None else None,
                    "interactive": False,
                }
                for i in range(self.n_slots)
            ]
            return SchedulerSnapshot(
                n_slots=self.n_slots,
                busy_slots=int(busy is not None),
                queue_depth=len(self._queue),
                kv_used=0,
                kv_capacity=self.n_ctx_seq * self.n_slots,
                steps=self._generated,
                tokens_generated=self._generated,
                tokens_prompt=self._prompt_tokens,
                slots=slots,
            )

    def wait_idle(self, timeout: float = 30.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            snap = self.snapshot()
            if snap.busy_slots == 0 and snap.queue_depth == 0:
                return True
            time.sleep(0.01)
        return False

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stop:
                    self._cond.wait()
                if self._stop:
                    left, self._queue = list(self._queue), deque()
                    break
                req = self._busy = self._queue.popleft()
            self._answer(req)
            with self._cond:
                self._busy = None
        for req in left:
            self._finish(req, "cancelled", time.perf_counter())

    def _answer(self, req: Request) -> None:
        """The scripted reply, token by token: the loop's stop rules, in its order."""
        t0 = time.perf_counter()
        req._emit(Started(req.id, 0))
        self._prompt_tokens += len(req.prompt)
        tokens = self.model.tokenize(self.model.next_reply(req.prompt, req.sampling, req.stream))
        stream = TextStream(req.sampling.stop)
        reason: StopReason = "stop"  # the reply's end stands for the end-of-generation token
        n = 0
        for tok in tokens:
            if req.cancelled:
                reason = "cancelled"
                break
            if req.deadline is not None and time.perf_counter() > req.deadline:
                reason = "timeout"
                break
            n += 1
            self._generated += 1
            self._out(req, stream.push(self.model.token_bytes(tok)), n)
            if stream.stopped:
                reason = "stop_string"
                break
            if n >= req.sampling.max_tokens:
                reason = "length"
                break
        if reason not in ("stop_string", "cancelled"):
            self._out(req, stream.flush(), n)
        req.stats.gen_tokens = n
        req.stats.ttft_s = req.stats.ttft_s or time.perf_counter() - t0
        self._finish(req, reason, t0)

    @staticmethod
    def _out(req: Request, text: str, n: int) -> None:
        if not text:
            return
        req.text += text
        if req.stream:
            req._emit(Piece(req.id, text, n))

    @staticmethod
    def _finish(req: Request, reason: StopReason, t0: float) -> None:
        st: GenerationStats = req.stats
        st.stop_reason = reason
        st.total_s = time.perf_counter() - t0
        req._emit(Finished(req.id, req.text, st))
        req.done.set()


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


__all__ = ["DEFAULT_REPLY", "FakeLoop", "FakeModel", "Seen", "serve_fake"]
