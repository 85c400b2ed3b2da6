"""Sampling, stop conditions and finishing: what happens to a slot after its rows decode.

`Finisher.sample` draws each slot's next token from its own sampler chain (with a grammar's
mask applied to the logits row first, and a repeat penalty by `engine.host.greedy_pick`, which
also picks a greedy request's token: the chain's own result without its per-call cost over the
whole vocabulary), verifies drafted tokens (engine.host.speculative: every token handed out is
the model's own sample at that position), and hands text out through the
slot's `TextStream` (UTF-8 reassembly, stop strings). A request ends on an end-of-generation
token, a stop string, a finished grammar, its token limit or a full context; ending drops the
cells it no longer owns first, so a request is reported done only once the cache holds exactly
the slot's tokens. A request that asks for log probabilities gets them from each row it
samples, after its mask and before its chain (engine.host.logprobs); a drafted token's come
from its verification row, the logits of the same position. Everything goes through the
`ContextBackend`. A request with a reasoning budget takes the tokens its `BudgetKeeper`
forces (the thinking block's close) in place of a sample; its chain still accepts them.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import numpy.typing as npt

from engine.host.greedy_pick import GreedyPicker, RepeatWindow, penalised_here, usable
from engine.host.logprobs import TokenLogprob, log_softmax, token_logprob
from engine.host.requests import Failed, Finished, Piece, Request
from engine.host.slots import LoopCounters, Slot
from engine.host.speculative import PromptLookup, trim_sequence
from engine.host.stats import StopReason
from engine.media.prompt import is_placeholder
from engine.native.backend import ContextBackend


class Finisher:
    """Samples, stops and finishes the slots of one context (the decode thread only)."""

    def __init__(
        self,
        backend: ContextBackend,
        n_ctx_seq: int,
        counters: LoopCounters,
        lock: threading.Condition,
    ) -> None:
        self.backend = backend
        self.n_ctx_seq = n_ctx_seq
        self.n_seq_max = backend.n_seq_max
        self.counters = counters
        self.lock = lock  # the scheduler's: a slot is freed under it
        # By request id: the repeat penalty (and greedy pick) the loop applies itself, None
        # where the chain does all.
        self._pickers: dict[int, RepeatWindow | None] = {}

    def picker(self, s: Slot) -> RepeatWindow | None:
        """The slot's greedy picker (`usable`), or its repeat window (`penalised_here`),
        else None. Made at its first sample: its window is what the chain was given (the
        prompt's tail without media rows), then every token handed out."""
        req = s.req
        if req is None:
            return None
        if req.id in self._pickers:
            return self._pickers[req.id]
        sp = req.sampling
        p: RepeatWindow | None = None
        if usable(sp) or penalised_here(sp):
            n = sp.repeat_last_n if sp.penalizes else 0
            tail = [t for t in req.prompt[-n:] if not is_placeholder(t)] if n > 0 else []
            kind = GreedyPicker if usable(sp) else RepeatWindow
            p = kind(sp, [*tail, *req.tokens])
        self._pickers[req.id] = p
        return p

    def reap(self, slots: list[Slot]) -> None:
        """Finish cancelled and timed-out requests before building the next batch."""
        now = time.perf_counter()
        for s in slots:
            r = s.req
            if r is None:
                continue
            if r.cancelled:
                self.finish(s, "cancelled")
            elif r.deadline is not None and now > r.deadline:
                self.finish(s, "timeout")

    def sample(self, s: Slot) -> None:
        """Sample the slot's row(s): its next token, and with drafts, the model's token at
        each drafted position while the drafts agree (the rest of their cells are dropped)."""
        be = self.backend
        req = s.req
        assert req is not None and s.sampler is not None
        drafts, s.drafts = s.drafts, []
        base = len(s.tokens) - len(drafts)  # cells through the token decoded before the drafts
        req.stats.draft_tokens += len(drafts)
        self.counters.drafted += len(drafts)
        if req.mask is not None:  # (no drafts: Scheduler._make_drafter)
            req.mask.apply(be.logits(s.batch_idx))
        window = self.picker(s)
        pick = window if isinstance(window, GreedyPicker) else None
        for i in range(len(drafts) + 1):
            row = s.batch_idx + i
            # Read before the window, which penalises the row in place.
            lp = None if req.logprobs is None else log_softmax(be.logits(row))
            forced = None if req.thinking is None else req.thinking.forced()
            if forced is not None:  # the budget closes the thinking block (no drafts)
                tok = forced
                be.sampler_accept(s.sampler, tok)
                if window is not None:
                    window.accept(tok)
            elif pick is not None:
                tok = pick.pick(be.logits(row))
                be.sampler_accept(s.sampler, tok)  # the chain stays in step
            elif window is not None:
                window.penalise(be.logits(row))
                tok = be.sample(s.sampler, row)
                window.accept(tok)
            else:
                tok = be.sample(s.sampler, row)
            entry = None if lp is None else self.logprob(lp, tok, req)
            accepted = i < len(drafts) and tok == drafts[i]
            if accepted:
                req.stats.draft_accepted += 1
                self.counters.accepted += 1
            else:
                self.trim(s, base + i)  # the drafts after the model's own token are dead
                if drafts and isinstance(s.drafter, PromptLookup):
                    s.drafter.verified(len(drafts), i)  # its request's own check
                if drafts and s.drafter is not None and not s.drafter.sets_length:
                    # Grow after a fully accepted draft, else one more than was accepted.
                    s.k = min(s.draft_max, s.k + 1) if i == len(drafts) else i + 1
            # Finishing inside the accepted drafts leaves the later ones dead too.
            if not self.emit_token(s, tok, keep=base + i + accepted, pos=base + i, lp=entry):
                return
            if not accepted:
                s.next_token = tok
                return

    def logprob(self, lp: npt.NDArray[np.float32], tok: int, req: Request) -> TokenLogprob:
        assert req.logprobs is not None
        be = self.backend
        text = be.token_to_piece(tok, req.sampling.special_text)
        return token_logprob(lp, tok, text, req.logprobs, lambda t: be.token_to_piece(t, True))

    def emit_token(
        self, s: Slot, tok: int, keep: int, pos: int, lp: TokenLogprob | None = None
    ) -> bool:
        """Hand out one generated token, which goes at position `pos` (`lp`: its log
        probabilities, when asked for); False when the request finished with it. Finishing
        first drops the slot's cells from `keep` on: the request is reported done (and its
        slot free) only once the cache holds exactly the slot's tokens."""
        req = s.req
        assert req is not None
        if self.backend.is_eog(tok):
            self.trim(s, keep)
            self.finish(s, "stop")
            return False
        if req.mask is not None and not req.mask.consume(tok):
            self.trim(s, keep)
            self.finish(s, "error", f"the reply left its grammar: {req.mask.error}")
            return False
        s.n_gen += 1
        self.counters.tok_gen += 1
        req.tokens.append(tok)
        if lp is not None:  # reported once its text is out (the end token never is)
            req.held_logprobs.append(lp)
        s.t_last = time.perf_counter()
        if s.drafter is not None:
            s.drafter.accept(tok)
        assert s.stream is not None
        piece = self.backend.token_to_piece(tok, req.sampling.special_text)
        if req.thinking is not None:
            req.thinking.accept(tok, piece)
        self.out(s, s.stream.push(piece))
        reason: StopReason | None = None
        if s.stream.stopped:
            reason = "stop_string"
        elif req.mask is not None and req.mask.complete:
            reason = "stop"  # the grammar allows nothing more: no need to wait for EOG
        elif s.n_gen >= req.sampling.max_tokens:
            reason = "length"
        elif pos + 1 >= self.n_ctx_seq:  # (not len(tokens): they hold this step's drafts)
            reason = "context_full"
        if reason is None:
            return True
        self.trim(s, keep)
        self.finish(s, reason)
        return False

    def trim(self, s: Slot, keep: int) -> None:
        if len(s.tokens) <= keep:
            return  # (every plain step: nothing was drafted past the token)
        trim_sequence(self.backend, s.seq, s.tokens, keep)
        s.exact_len = min(s.exact_len, len(s.tokens))

    def out(self, s: Slot, text: str) -> None:
        req = s.req
        if not text or req is None:
            return
        if s.t_first is None:
            s.t_first = time.perf_counter()
            req.stats.ttft_s = s.t_first - req.t_submit
        req.text += text
        lps: tuple[TokenLogprob, ...] = ()
        if req.held_logprobs:  # this text completes them
            lps = tuple(req.held_logprobs)
            req.held_logprobs.clear()
            req.token_logprobs.extend(lps)
        if req.stream:
            req.emit(Piece(req.id, text, s.n_gen, lps))

    def finish(self, s: Slot, reason: StopReason, error: str | None = None) -> None:
        be = self.backend
        req = s.req
        assert req is not None
        if reason not in ("stop_string", "cancelled", "error") and s.stream is not None:
            self.out(s, s.stream.flush())
        if reason in ("cancelled", "error") and 0 <= s.seq < self.n_seq_max:
            # The client is gone (or the cache is suspect): free the cells now.
            be.seq_rm(s.seq)
            s.tokens.clear()
            s.exact_len = 0
        if s.sampler is not None:
            be.sampler_free(s.sampler)
        if s.drafter is not None:
            s.drafter.end()
        self._pickers.pop(req.id, None)
        st = req.stats
        st.gen_tokens = s.n_gen
        st.total_s = time.perf_counter() - req.t_submit
        if s.t_first is None:
            st.ttft_s = st.total_s
        if s.t_first is not None and s.t_last is not None and s.n_gen > 1 and s.t_last > s.t_first:
            st.gen_tps_wall = (s.n_gen - 1) / (s.t_last - s.t_first)
        st.stop_reason = reason
        st.error = error
        st.finalize_rates()
        with self.lock:
            s.clear_request()
            s.last_used = time.perf_counter()
        req.held_logprobs.clear()  # text a stop string took, or never completed
        done = Failed if reason == "error" else Finished
        req.emit(done(req.id, req.text, st, tuple(req.token_logprobs)))
        if req.media is not None:
            req.media.close()
        req.done.set()


def finish_unscheduled(req: Request, reason: StopReason) -> None:
    """End a request that never had a slot (cancelled or timed out while queued, or the
    loop closed under it)."""
    st = req.stats
    st.total_s = st.ttft_s = st.queue_s = time.perf_counter() - req.t_submit
    st.stop_reason = reason
    req.emit(Finished(req.id, "", st))
    if req.media is not None:
        req.media.close()
    req.done.set()


__all__ = ["Finisher", "finish_unscheduled"]
