"""What a client hands the decode loop and what it gets back: a `Request` and its events.

Every client of a model's loop (the chat, the HTTP routes, the benchmark, `candlewick run`)
imports these, and nothing here decodes, so they live apart from the loop
(engine.host.scheduler): a module that reads events never depends on the loop's machinery.
Events carry the request's id; `Failed` is a `Finished` whose stats say why.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.decoding.constraints import TokenMask
from engine.decoding.thinking_budget import BudgetKeeper
from engine.errors import EngineError
from engine.host.logprobs import TokenLogprob
from engine.host.stats import GenerationStats
from engine.media.prompt import MediaPrompt
from engine.settings import SamplingParams, SpecMode

log = logging.getLogger("candlewick.scheduler")


class QueueFull(EngineError):
    """The scheduler's wait queue is full; the caller should retry later."""


class SchedulerClosed(EngineError):
    """The scheduler has been shut down."""


@dataclass(frozen=True)
class Started:
    """The request has a slot; `cached_tokens` of its prompt are reused from the KV cache."""

    rid: int
    cached_tokens: int


@dataclass(frozen=True)
class Piece:
    rid: int
    text: str
    n_tokens: int  # tokens generated so far
    # With `Request.logprobs`: the tokens whose text this piece completes (held-back text's
    # tokens come with the piece that releases it).
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Finished:
    rid: int
    text: str  # the whole reply
    stats: GenerationStats
    # With `Request.logprobs`: every token whose text is in `text`, in order (not the end
    # token, nor those a stop string took).
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Failed(Finished):
    """Finished with stop_reason "error": a decode failed; `stats.error` says why (one line)."""

    @property
    def message(self) -> str:
        return self.stats.error or "generation failed"


Event = Started | Piece | Finished
EventCallback = Callable[[Event], None]


class Request:
    """One submitted generation. Thread-safe to cancel; events arrive via `on_event`."""

    def __init__(
        self,
        rid: int,
        prompt: list[int],
        sampling: SamplingParams,
        on_event: EventCallback,
        *,
        stream: bool,
        deadline: float | None,
        wake: Callable[[], None],
        cancel: threading.Event | None,
        interactive: bool,
        spec: SpecMode | None,
        canonical: bool,
        logprobs: int | None = None,
        lora: tuple[float, ...] = (),
    ) -> None:
        self.id = rid
        # Its LoRA adapters' scales: decoded only in batches of requests with the same ones.
        self.lora = lora
        self.prompt = prompt
        self.sampling = sampling
        self.stream = stream
        self.deadline = deadline
        self.interactive = interactive
        self.spec = spec  # None: the model's own setting
        # Read the prompt the canonical way (engine.host.batch_plan) so that the same prompt
        # gives the same reply however the cache was left.
        self.canonical = canonical and sampling.reproducible
        self._on_event = on_event
        self._wake = wake
        self._cancel = threading.Event()
        self._external = cancel  # the caller's stop flag, checked before every step
        self.done = threading.Event()
        self.t_submit = time.perf_counter()
        self.stats = GenerationStats(prompt_tokens=len(prompt))
        self.text = ""
        self.tokens: list[int] = []  # generated token ids
        # Log probabilities asked for: None, or how many alternatives per token
        # (engine.host.logprobs); those of the tokens handed out, and of tokens whose text
        # is still held back (a partial character, a possible stop string).
        self.logprobs = logprobs
        self.token_logprobs: list[TokenLogprob] = []
        self.held_logprobs: list[TokenLogprob] = []
        # The grammar the reply must follow (built by submit, used on the decode thread).
        self.mask: TokenMask | None = None
        # Its images and audio: where `prompt` holds placeholders, the rows to decode.
        self.media: MediaPrompt | None = None
        # Its reasoning budget (engine.decoding.thinking_budget): the tokens it forces on
        # the loop (`Scheduler.submit(thinking=...)`; never drafted).
        self.thinking: BudgetKeeper | None = None

    def cancel(self) -> None:
        """Stop this request; its slot and KV cells are freed before the next step."""
        self._cancel.set()
        self._wake()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set() or (self._external is not None and self._external.is_set())

    def emit(self, ev: Event) -> None:
        """Hand `ev` to the caller's callback (the decode thread calls this)."""
        try:
            self._on_event(ev)
        except Exception:  # a broken consumer must not take the loop down
            log.debug("event callback failed for request %d", self.id, exc_info=True)


@dataclass
class SchedulerSnapshot:
    n_slots: int
    busy_slots: int
    queue_depth: int
    kv_used: int  # KV cells held by all sequences (including idle slots' reusable prefixes)
    kv_capacity: int
    steps: int
    tokens_generated: int
    tokens_prompt: int
    slots: list[dict[str, Any]] = field(default_factory=list)
    kv_copies: int = 0  # KV streams copied between slots (shared prefixes, closed holes)
    draft_tokens: int = 0  # drafted and verified, over all requests
    draft_accepted: int = 0
    # What drafting measured on this model and machine, per number of generating slots
    # (engine.host.draft_gain; levels not measured yet left out).
    draft_gain: dict[int, float] = field(default_factory=dict)
    reserved_slots: int = 0  # kept for interactive requests (the chat)
    snapshots_saved: int = 0  # KV states saved to / restored from the model's state cache
    snapshots_restored: int = 0


__all__ = [
    "Event",
    "EventCallback",
    "Failed",
    "Finished",
    "Piece",
    "QueueFull",
    "Request",
    "SchedulerClosed",
    "SchedulerSnapshot",
    "Started",
]
