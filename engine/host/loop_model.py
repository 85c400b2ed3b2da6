"""What the decode loop reads of a loaded model: a small typed view, not `Model` itself.

`engine.host.runtime.Model` satisfies it; so can a test double built on a fake
`ContextBackend` (engine.native.backend), which is how the scheduler's policy (admission,
priority, reserved slots, leases, KV layout, cancellation) is tested without a model. The
loop never imports `runtime`: that is what keeps `engine.host` free of import circles.
"""

from __future__ import annotations

from typing import Protocol

from engine.decoding.constraints import TokenMask
from engine.host.prompt_cache import PromptStateCache
from engine.host.speculative import CostModel, Speculator
from engine.memory.actual import ActualMemory
from engine.memory.cpu_kernels import SplitRule
from engine.native.backend import ContextBackend
from engine.settings import LoadParams


class LoopModel(CostModel, Protocol):
    """A model as its `Scheduler` sees it.

    `backend`: the current context (None once unloaded; `recreate_context` replaces it).
    `params`: its load settings (`n_batch`, `speculative`). `split_rule`: how a reproducible
    prompt may be cut into batches (engine.host.batch_plan). `state_cache`: saved KV states of
    conversations (None: none kept). `speculator`: its draft model, if loaded.
    `grammar_mask`: a fresh grammar state for one request, built on the caller's thread.
    `memory_actual`: what its context allocated (a KV copy between slots is weighed by it).
    `flash_attn_on`: whether its context uses flash attention.
    `scheduler`: its loop once made (a second loop on the same context is refused)."""

    @property
    def backend(self) -> ContextBackend | None: ...
    @property
    def params(self) -> LoadParams: ...
    @property
    def split_rule(self) -> SplitRule: ...
    @property
    def flash_attn_on(self) -> bool: ...
    @property
    def state_cache(self) -> PromptStateCache | None: ...
    @property
    def speculator(self) -> Speculator | None: ...
    @property
    def memory_actual(self) -> ActualMemory: ...
    @property
    def scheduler(self) -> object | None: ...
    @property
    def lora_scales(self) -> tuple[float, ...]:
        """Its LoRA adapters' scales for a request that names none (() without adapters)."""

    def grammar_mask(self, grammar: str) -> TokenMask: ...
    def recreate_context(self, n_seq_max: int, n_ctx: int) -> None: ...


__all__ = ["LoopModel"]
