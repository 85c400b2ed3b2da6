"""How a prompt is cut into decode batches, so that the same prompt always gets the
same logits (temperature 0 regenerate, continue and reload give the same text).

On CPU, llama.cpp computes a token's activations with different kernels alone and in a batch
(engine.memory.cpu_kernels), so the key/value entries of a position depend on how it was
batched. Two things used to change that between an answer and its regeneration: the last prompt
token was decoded alone (the rest of the prompt was reused from the cache, but at least one
token must be decoded for fresh logits), and the previous answers' tokens, decoded one by one as
they were generated, were reused where a fresh load decodes them in a batch. So a reproducible
prompt is evaluated the *canonical* way: every prompt token in a batch, never a generated
token's entry, and a cached prefix is reused only as far as it was evaluated that way (`Model`
counts it).

What "the same batches" must mean depends on the kernels (`cpu_kernels.split_rule`):

* "any": batching never changes the logits; everything cached is reused.
* "multi": any batches of two or more tokens give the same logits; the cached prompt is reused
  and at least the last two prompt tokens are decoded again, never one alone.
* "grid": only identical batches do: batches start at multiples of `n_batch` from position 0,
  and reuse stops at the last such boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.memory.cpu_kernels import SplitRule


@dataclass(frozen=True)
class BatchPlan:
    start: int  # cached tokens kept; decoding starts here
    sizes: tuple[int, ...]  # the batches that follow, in order


def plan(n_tokens: int, reusable: int, n_batch: int, rule: SplitRule) -> BatchPlan:
    """Batches for a prompt of `n_tokens` when its first `reusable` tokens are in the KV cache
    in a form this rule may reuse. At least the last token is always decoded (fresh logits)."""
    if n_tokens < 1:
        raise ValueError("the prompt is empty")
    n_batch = max(1, n_batch)
    start = max(0, min(reusable, n_tokens - 1))
    if rule == "grid":
        start -= start % n_batch
    elif rule == "multi":
        start = max(0, min(start, n_tokens - 2))
    sizes = [min(n_batch, n_tokens - p) for p in range(start, n_tokens, n_batch)]
    if rule == "multi" and len(sizes) > 1 and sizes[-1] == 1 and n_batch > 2:
        sizes[-2:] = [sizes[-2] - 1, 2]  # no prompt token alone
    return BatchPlan(start, tuple(sizes))


__all__ = ["BatchPlan", "plan"]
