"""A request to a model's decode loop, read from one thread: iterate for text pieces.

`Model.generate`/`Model.complete`, the chat (`EmbeddedEngine`) and `candlewick run` use this;
the HTTP server reads the same events on its event loop instead (engine.server). Nothing here
decodes: the tokens come from the model's `Scheduler`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from engine.errors import EngineError
from engine.host.requests import Event, Failed, Finished, Piece, Request
from engine.host.stats import GenerationStats
from engine.media.prompt import MediaPrompt
from engine.settings import SamplingParams, SpecMode

if TYPE_CHECKING:
    from engine.host.scheduler import Scheduler

# How often a reader waiting for the next event looks at its stop flag. The decode loop
# itself checks the flag before every step; this only matters while a request is queued.
_POLL_S = 0.05
# How often `consume` wakes while the reply is still coming: it needs only the end.
_CONSUME_S = 0.1


class Generation:
    """An in-progress reply: iterate for text pieces; `stats` is complete when exhausted.

    `cancel` (a `threading.Event`, settable from any thread) stops it before the next step.
    A failed decode raises EngineError from the iteration, after the text so far."""

    def __init__(
        self,
        scheduler: Scheduler,
        prompt: list[int],
        sampling: SamplingParams,
        cancel: threading.Event | None = None,
        *,
        interactive: bool = True,
        spec: SpecMode | None = None,
        media: MediaPrompt | None = None,
        lora: dict[int, float] | None = None,
    ) -> None:
        self.prompt = prompt
        self.sampling = sampling
        self.cancel = cancel or threading.Event()
        self.text = ""
        self.done = False
        self._q: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.request: Request = scheduler.submit(
            prompt,
            sampling,
            self._q.put,
            stream=True,
            cancel=self.cancel,
            interactive=interactive,
            spec=spec,
            media=media,
            lora=lora,
        )

    @property
    def id(self) -> int:
        """The request's id in the decode loop: every event about it carries it."""
        return self.request.id

    @property
    def stats(self) -> GenerationStats:
        return self.request.stats

    @property
    def tokens(self) -> list[int]:
        """Token ids generated so far."""
        return self.request.tokens

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        while not self.done:
            try:
                ev = self._q.get(timeout=_POLL_S)
            except queue.Empty:
                if self.cancel.is_set():
                    self.request.cancel()
                continue
            text = self._take(ev)
            if text is not None:
                return text
        raise StopIteration

    def _take(self, ev: Event) -> str | None:
        """An event's text, or None for the end (`done` is then set); raises on a failure."""
        if ev.rid != self.request.id:  # pragma: no cover - the loop never mixes them
            raise EngineError(f"request {self.request.id} got an event for {ev.rid}")
        if isinstance(ev, Piece):
            self.text += ev.text
            return ev.text
        if isinstance(ev, Failed):
            self.done = True
            raise EngineError(ev.message)
        if isinstance(ev, Finished):
            self.done = True
        return None

    def paced(self, interval_s: float) -> Iterator[str]:
        """The text in pieces gathered over `interval_s` each (less for the last: the end
        wakes the reader): it wakes a few times a second instead of at every token. On two
        cores every wake-up takes a core from llama.cpp's threads for a moment and stalls them
        at their next barrier; a terminal or a final result does not need each token's own."""
        while not self.done:
            first = next(self, None)
            if first is None:
                return
            parts = [first]
            if not self.done:
                # The loop emits Finished before it sets `done`: the drain below sees the end.
                self.request.done.wait(interval_s)
            while not self.done:
                try:
                    text = self._take(self._q.get_nowait())
                except queue.Empty:
                    break
                if text is not None:
                    parts.append(text)
            yield "".join(parts)

    def consume(self) -> str:
        """Reads the reply to its end, `paced` (waking every `_CONSUME_S` at most): the text."""
        for _ in self.paced(_CONSUME_S):
            pass
        return self.text

    def __del__(self) -> None:
        # A reader that stops iterating without cancelling must not leave the loop generating
        # for nobody.
        req = getattr(self, "request", None)
        if req is not None and not req.done.is_set():
            req.cancel()

    def close(self) -> None:
        """Stop reading: the request is cancelled (its cells freed) unless it has ended."""
        if not self.request.done.is_set():
            self.request.cancel()
            self.request.done.wait()
        self.done = True


__all__ = ["Generation"]
