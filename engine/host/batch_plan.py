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
* "tiled": any batches of `FA_TILE_Q` (64) or more tokens give the same logits (CPU flash
  attention's tiled kernel); the cached prompt is reused and at least the last 64 prompt
  tokens are decoded again, in batches of 64 or more, each alone in its step. A prompt shorter
  than that is read whole, alone (the row-by-row kernel), and is not counted as canonical:
  a longer prompt reads those positions the tiled way.
* "grid": only identical batches do: batches start at multiples of `n_batch` from position 0,
  and reuse stops at the last such boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.memory.cpu_kernels import FA_TILE_Q, SplitRule


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
    if rule == "tiled" and n_batch < 2 * FA_TILE_Q:
        rule = "grid"  # too small a batch to keep every cut at 64+ tokens; the same cuts agree
    start = max(0, min(reusable, n_tokens - 1))
    if rule == "tiled":
        start = max(0, min(start, n_tokens - FA_TILE_Q)) if n_tokens >= FA_TILE_Q else 0
    elif rule == "grid":
        start -= start % n_batch
    elif rule == "multi":
        start = max(0, min(start, n_tokens - 2))
    sizes = [min(n_batch, n_tokens - p) for p in range(start, n_tokens, n_batch)]
    if rule == "multi" and len(sizes) > 1 and sizes[-1] == 1 and n_batch > 2:
        sizes[-2:] = [sizes[-2] - 1, 2]  # no prompt token alone
    if rule == "tiled" and len(sizes) > 1 and sizes[-1] < FA_TILE_Q:
        short = FA_TILE_Q - sizes[-1]
        sizes[-2:] = [sizes[-2] - short, FA_TILE_Q]  # every batch takes the tiled kernel
    return BatchPlan(start, tuple(sizes))


def counts_as_canonical(n_prompt: int, rule: SplitRule) -> bool:
    """Whether a prompt of `n_prompt` tokens, read by `plan`, leaves positions that a longer
    prompt may reuse: under "multi" a one-token prompt was read alone, under "tiled" a prompt
    shorter than FA_TILE_Q row by row, unlike a longer prompt's tiled batches."""
    if rule == "multi":
        return n_prompt > 1
    if rule == "tiled":
        return n_prompt >= FA_TILE_Q
    return True


__all__ = ["BatchPlan", "counts_as_canonical", "plan"]
