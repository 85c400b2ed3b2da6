"""Batch building: what one step of the decode loop decodes.

Every step writes one batch: the next token of every generating slot (with its drafts), plus
chunks of prompts still being read, in sequence-id order
(llama.cpp splits a batch at every break in the ids). A reproducible prompt cut the canonical
way (engine.host.batch_plan) goes in its planned chunks, alone. Each slot's rows are checked
against the context's limits before they are written (engine.host.decode_guard), then one
`decode` runs, its time is counted to each request it carried, and the `Finisher` samples the
rows that want logits.

Speculative decoding (engine.host.speculative): in a step where no prompt is being read,
every generating slot whose request drafts adds its drafts after its token, and the one decode
verifies them all beside the other slots' tokens. Whether that pays depends on the machine
and on how many slots share the step (with several, the batch already keeps the hardware
busy and every drafted row costs the others), so it is measured as the loop runs
(engine.host.draft_gain): each lone step's decode by its size (prompt lookup sizes its drafts
with that curve rather than with another CPU's), and the time per token of steps with drafts
and without, per number of generating slots and kind of draft; a kind is drafted at a level
only while it measures faster there.
"""

from __future__ import annotations

import time

from engine.host import batch_plan, decode_guard
from engine.host.draft_gain import bucket, gains_for
from engine.host.finishing import Finisher
from engine.host.loop_model import LoopModel
from engine.host.media_steps import MediaSteps
from engine.host.slots import LoopCounters, Slot
from engine.host.speculative import PromptLookup, propose_drafts, verify_cost
from engine.memory import cpu_kernels
from engine.native.backend import ContextBackend, DecodeFailed, TokenBatch


class BatchBuilder:
    """Builds and decodes the steps of one context's slots (the decode thread only)."""

    def __init__(
        self,
        model: LoopModel,
        backend: ContextBackend,
        slots: list[Slot],
        n_batch: int,
        counters: LoopCounters,
        finisher: Finisher,
    ) -> None:
        self.model = model
        self.backend = backend
        self.slots = slots
        self.n_batch = n_batch
        self.n_ctx_seq = backend.n_ctx_seq
        self.counters = counters
        self.finisher = finisher
        self.batch: TokenBatch | None = backend.batch(n_batch)
        self.media = MediaSteps(backend, n_batch, counters, finisher)
        self.gain = gains_for(model, verify_cost(model))
        self.clock = time.perf_counter  # what steps are timed with (a test's fake clock)

    def close(self) -> None:
        if self.batch is not None:
            self.batch.close()
            self.batch = None
        self.media.close()

    def lora_turn(self) -> tuple[float, ...] | None:
        """The LoRA scales this step decodes under: the oldest request's with work. Adapters
        are the context's, so a batch holds only requests with the same scales (as
        llama-server's are_lora_equal); the others wait for a step of their own."""
        working = [
            s.req
            for s in self.slots
            if s.req is not None and (s.next_token is not None or s.pending)
        ]
        return min(working, key=lambda r: r.t_submit).lora if working else None

    def chunks(self, lora: tuple[float, ...]) -> tuple[dict[int, int], bool]:
        """How many prompt tokens each prefilling slot reads this step, and whether the step
        is one canonical chunk alone (the generating slots then wait one step). A "grid" or
        "tiled" prompt goes in its planned batches, alone (another slot's rows would change
        its batch's size, and so its kernel); a "multi" one in cuts of two or more tokens,
        beside the others."""
        prefill = sorted(
            (s for s in self.slots if s.req is not None and s.pending and s.req.lora == lora),
            key=lambda s: s.req.t_submit if s.req else 0.0,
        )
        if prefill and prefill[0].plan:
            first = prefill[0]
            assert first.plan is not None
            return {first.seq: first.plan[0]}, True
        if prefill and (n := self.media.rows_due(prefill[0])):
            return {prefill[0].seq: n}, True  # a media chunk's rows go alone
        room = self.n_batch - sum(
            1
            for s in self.slots
            if s.req is not None and s.next_token is not None and s.req.lora == lora
        )
        out: dict[int, int] = {}
        for s in prefill:
            if room <= 0:
                break
            if s.plan or self.media.rows_due(s):
                continue  # canonical chunks and media wait until they can go alone
            k = min(room, len(s.pending), self.media.text_due(s))
            if s.rule == "multi" and len(s.pending) > 1:
                # Any cut of two or more tokens reads the same: never leave one alone.
                if len(s.pending) - k == 1:
                    k -= 1
                if k < 2:
                    continue
            out[s.seq] = k
            room -= k
        return out, False

    def splits_by_threads(self, rows: list[Slot]) -> bool:
        """Whether a one-row step decodes a reproducible reply (engine.host.batch_plan) where
        llama.cpp's CPU flash attention splits the cache across the threads: one query over
        SPLIT_KV_CELLS+ cells (the cache is viewed in steps of KV_VIEW_PAD), whose sums then
        depend on the thread count. Such a step runs on the load's own count. The project's
        build (`fa_small_tiles`) takes no such path."""
        return (
            self.model.flash_attn_on
            and not cpu_kernels.detect().fa_small_tiles
            and any(
                s.req is not None
                and s.req.canonical
                and len(s.tokens) > cpu_kernels.SPLIT_KV_CELLS - cpu_kernels.KV_VIEW_PAD
                for s in rows
            )
        )

    def step(self) -> None:
        """Write, decode and sample one batch (nothing when no slot has work)."""
        b = self.batch
        assert b is not None
        put = b.put
        t_step = self.clock()
        produced = self.counters.tok_gen
        lora = self.lora_turn()
        if lora is None:
            return
        self.backend.apply_lora(lora)
        chunk_len, solo = self.chunks(lora)
        if solo:
            ((seq, k),) = chunk_len.items()
            s = self.slots[seq]
            if self.media.rows_due(s):
                for other in self.slots:
                    other.batch_idx, other.n_in_batch = -1, 0
                self.media.step(s, k)
                return
        gen = [
            s
            for s in self.slots
            if s.req is not None and s.next_token is not None and s.req.lora == lora
        ]
        busy = len(gen)  # generating slots: the level drafting is measured at
        may_draft = self.may_draft(gen, solo)
        # With other slots in the step, the step drafts or not as a whole (one kind): its
        # time is what is measured. Alone, each proposal is judged by its kind (`propose`).
        gate_open = may_draft and (busy == 1 or self.gain.allow(busy, 0))
        room = self.n_batch - busy  # rows left for drafts once every slot has its token
        kinds: list[int] = []  # of the drafts this step verifies
        # Written in sequence-id order: llama.cpp splits a batch at every break in the ids.
        n = 0
        rows: list[Slot] = []
        for s in self.slots:
            s.batch_idx = -1
            s.n_in_batch = 0
            if s.req is None or s.req.lora != lora:
                continue
            if s.next_token is not None:
                if solo:
                    continue
                s.drafts = []
                if gate_open and s.drafter is not None and room > 0:
                    s.drafts, kind = self.propose(s, busy, room)
                    room -= len(s.drafts)
                    if s.drafts:
                        kinds.append(kind)
                refused = self.refusal(s, n, 1 + len(s.drafts))
                if refused:
                    self.finisher.finish(s, "error", refused)
                    continue
                s.batch_idx = n
                for tok in (s.next_token, *s.drafts):
                    put(n, tok, len(s.tokens), s.seq, True)
                    s.tokens.append(tok)
                    n += 1
                s.n_in_batch = 1 + len(s.drafts)
                s.prefilling = False
                s.next_token = None
                rows.append(s)
                continue
            k = chunk_len.get(s.seq, 0)
            if not k:
                continue
            refused = self.refusal(s, n, k)
            if refused:
                self.finisher.finish(s, "error", refused)
                continue
            chunk = s.pending[:k]
            del s.pending[:k]
            if s.plan:
                s.plan.popleft()
            last = not s.pending
            pos = len(s.tokens)
            for j, tok in enumerate(chunk):
                put(n, tok, pos + j, s.seq, last and j == k - 1)
                n += 1
            s.tokens.extend(chunk)
            s.n_in_batch = k
            s.prefilling = True
            self.counters.tok_prompt += k
            if last:
                s.batch_idx = n - 1
                rows.append(s)
        if n == 0:
            return
        b.n_tokens = n
        t0 = self.clock()
        try:
            self.backend.decode(b, fixed_threads=n == 1 and self.splits_by_threads(rows))
        except DecodeFailed as e:
            self.counters.steps += 1
            # The batch was not applied: drop what each slot thought it added.
            for s in self.slots:
                if s.req is not None:
                    self.finisher.finish(s, "error", str(e))
            return
        dt = self.clock() - t0
        dt_ms = dt * 1000
        self.counters.steps += 1
        if may_draft and busy == 1:
            self.gain.curve.observe(n, dt)  # a lone step: its size's cost
        for s in self.slots:
            if s.req is None or not s.n_in_batch:
                continue
            st = s.req.stats
            if s.prefilling:
                st.prompt_eval_ms += dt_ms
                st.n_prompt_eval += s.n_in_batch
                if (
                    not s.pending
                    and s.req.canonical
                    and batch_plan.counts_as_canonical(len(s.req.prompt), self.model.split_rule)
                ):
                    s.exact_len = len(s.tokens)  # read the canonical way, all of it
            else:
                st.eval_ms += dt_ms
                st.n_eval += s.n_in_batch
        if may_draft:
            figure = self.gain.gain(busy)
            for s in rows:
                if s.drafter is not None and s.req is not None:
                    s.req.stats.draft_gain = figure
        for s in rows:
            self.finisher.sample(s)
        if may_draft:
            made = self.counters.tok_gen - produced
            self.gain.observe(busy, made, self.clock() - t_step, max(kinds) if kinds else None)

    def refusal(self, s: Slot, n: int, k: int) -> str | None:
        """Why `k` more tokens of slot `s` after `n` in the batch must not be decoded: the
        batch buffer holds n_batch tokens (llama.cpp does not check what is written into
        it), a sequence holds n_ctx_seq positions, ids stop at n_seq_max."""
        try:
            decode_guard.check_batch(n + k, self.n_batch)
            decode_guard.check_seq(s.seq, self.backend.n_seq_max)
            decode_guard.check_room(len(s.tokens), k, self.n_ctx_seq)
        except decode_guard.DecodeRefused as e:
            return str(e)
        return None

    def may_draft(self, gen: list[Slot], solo: bool) -> bool:
        """Whether slots may draft this step: only while no prompt is read (a prompt's
        chunk fills the batch better) and one of the generating slots has a drafter."""
        if solo or any(s.req is not None and s.pending for s in self.slots):
            return False
        return any(s.drafter is not None for s in gen)

    def propose(self, s: Slot, busy: int, room: int) -> tuple[list[int], int]:
        """Slot `s`'s drafts (at most `room`) for a step of `busy` generating slots, and
        their kind. Alone, none while drafts of that kind measure slower than plain steps
        (engine.host.draft_gain): a draft model is asked first (its proposal costs decodes),
        a lookup after. With others, the step was judged already (`step`)."""
        drafter = s.drafter
        assert drafter is not None
        alone = busy == 1
        if isinstance(drafter, PromptLookup):
            drafter.cost = self.gain.curve  # sizes its drafts with what this machine measured
        elif alone and not self.gain.allow(busy, 0):
            return [], 0
        limit = s.draft_max if drafter.sets_length else s.k
        # Room for the drafts: the batch, and the context with a free cell left after them.
        drafts = propose_drafts(
            drafter, self.backend, min(limit, room, self.n_ctx_seq - 2 - len(s.tokens))
        )
        kind = bucket(drafter) if alone else 0
        if drafts and alone and isinstance(drafter, PromptLookup) and not self.gain.allow(1, kind):
            return [], kind
        return drafts, kind


__all__ = ["BatchBuilder"]
