"""Decode steps of images and audio: a media chunk's embedding rows, read by the loop.

A prompt with media (engine.media.prompt) holds placeholder ids where a media chunk's rows
go. When a slot's next prompt token is one, the step is that chunk's alone: the rows are
encoded by the projector the first time they are needed (on this thread, one at a time; a
chunk whose KV cells were reused is never encoded), written into an embeddings batch and
decoded through the same typed backend as every token, with causal attention turned off for
the step where the projector asks (Gemma 3's images). No other request's rows share the
step: non-causal rows would see them, and a half-read image must not sit beside another
request's tokens. Cancellation is checked before every step, so between chunks.
"""

from __future__ import annotations

import time

from engine.errors import EngineError
from engine.host import decode_guard
from engine.host.finishing import Finisher
from engine.host.slots import LoopCounters, Slot
from engine.media.prompt import MediaPrompt, is_placeholder
from engine.native.backend import ContextBackend, DecodeFailed, TokenBatch


def check_prompt(prompt: list[int], media: MediaPrompt | None, n_vocab: int, n_ubatch: int) -> None:
    """Refuse a prompt the loop could not read: a text token outside the vocabulary; with
    media, not its media prompt's tokens, or a chunk read with non-causal attention that
    does not fit one micro-batch (its rows see each other only there)."""
    if media is None:
        decode_guard.check_tokens(prompt, n_vocab)
        return
    if media.tokens != list(prompt):
        raise EngineError("the prompt is not its media prompt's tokens")
    decode_guard.check_tokens([t for t in prompt if not is_placeholder(t)], n_vocab)
    for span in media.spans:
        c = span.chunk
        if c.non_causal and c.n_tokens > n_ubatch:
            raise EngineError(
                f"an {c.kind} takes {c.n_tokens} tokens read at once, and the model was "
                f"loaded with micro-batches of {n_ubatch}; load it with --ubatch "
                f"{c.n_tokens} or more"
            )


class MediaSteps:
    """Media rows of the slots of one context (the decode thread only)."""

    def __init__(
        self,
        backend: ContextBackend,
        n_batch: int,
        counters: LoopCounters,
        finisher: Finisher,
    ) -> None:
        self.backend = backend
        self.n_batch = n_batch
        self.counters = counters
        self.finisher = finisher
        self._batch: TokenBatch | None = None
        self._n_embd = 0
        self.clock = time.perf_counter

    def close(self) -> None:
        if self._batch is not None:
            self._batch.close()
            self._batch = None

    def rows_due(self, s: Slot) -> int:
        """How many media rows slot `s` decodes next (0: its next prompt token is text)."""
        req = s.req
        if req is None or req.media is None or not s.pending or not is_placeholder(s.pending[0]):
            return 0
        span = req.media.span_at(len(s.tokens))
        if span is None:  # pragma: no cover - placeholders only stand in spans
            raise EngineError("a media placeholder outside its chunk")
        left = span.end - len(s.tokens)
        return left if span.chunk.non_causal else min(left, self.n_batch)

    def text_due(self, s: Slot) -> int:
        """How many of slot `s`'s pending tokens come before its next media chunk."""
        req = s.req
        if req is None or req.media is None:
            return len(s.pending)
        nxt = req.media.next_start(len(s.tokens))
        return len(s.pending) if nxt is None else nxt - len(s.tokens)

    def step(self, s: Slot, k: int) -> None:
        """Decode `k` rows of slot `s`'s current media chunk, alone."""
        req = s.req
        assert req is not None and req.media is not None
        media = req.media
        pos = len(s.tokens)
        span = media.span_at(pos)
        assert span is not None
        try:
            decode_guard.check_batch(k, self.n_batch)
            decode_guard.check_seq(s.seq, self.backend.n_seq_max)
            decode_guard.check_room(pos, k, self.backend.n_ctx_seq)
            fresh = span.rows is None
            t0 = self.clock()
            rows = media.embeddings(span)
            if fresh:
                req.stats.media_encoded += 1
                req.stats.media_encode_ms += (self.clock() - t0) * 1000
        except (decode_guard.DecodeRefused, EngineError) as e:
            self.finisher.finish(s, "error", str(e))
            return
        b = self._batch_for(rows.shape[1])
        off = pos - span.start
        last = k == len(s.pending)
        for j in range(k):
            b.put_embedding(j, rows[off + j], pos + j, s.seq, last and j == k - 1)
        b.n_tokens = k
        t0 = self.clock()
        try:
            self.backend.decode(b, causal=not span.chunk.non_causal)
        except DecodeFailed as e:
            self.counters.steps += 1
            self.finisher.finish(s, "error", str(e))
            return
        dt_ms = (self.clock() - t0) * 1000
        self.counters.steps += 1
        self.counters.tok_prompt += k
        s.tokens.extend(s.pending[:k])
        del s.pending[:k]
        s.prefilling = True
        s.n_in_batch = k
        st = req.stats
        st.prompt_eval_ms += dt_ms
        st.n_prompt_eval += k
        if last:
            s.batch_idx = k - 1
            self.finisher.sample(s)

    def _batch_for(self, n_embd: int) -> TokenBatch:
        if self._batch is None or self._n_embd != n_embd:
            self.close()
            self._batch = self.backend.batch(self.n_batch, n_embd)
            self._n_embd = n_embd
        return self._batch


__all__ = ["MediaSteps", "check_prompt"]
