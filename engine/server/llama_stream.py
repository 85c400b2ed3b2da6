"""What llama-server adds to a streamed chat answer, for a request that asks for it
(`protocol.llama.LlamaChatFields`): the `timings` so far on every chunk
(`timings_per_token`), the `prompt_progress` of its prompt (`return_progress`) and an SSE
comment when the stream has been silent for `sse_ping_interval` seconds. Its web UI asks
for all three with every message.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from engine.host.requests import Event, Piece, Started
from engine.server.engine_state import AsyncGeneration
from engine.server.protocol.llama import LlamaChatFields, PromptProgress, Timings

PING = ":\n\n"  # an SSE comment: clients skip it, proxies see bytes


class LlamaStream:
    """The extras one streamed request asked for, read from its generation."""

    def __init__(self, fields: LlamaChatFields, gen: AsyncGeneration) -> None:
        self.gen = gen
        self.per_token = bool(fields.timings_per_token)
        self.now: Timings | None = None  # the timings a chunk carries (timings_per_token)
        self._progress = bool(fields.return_progress)
        interval = fields.sse_ping_interval
        self._ping_s = float(interval) if interval is not None and interval > 0 else None
        self._started: float | None = None
        self._read = False  # the prompt's last progress has been sent

    async def events(self) -> AsyncIterator[Event | None]:
        """The generation's events; None where a ping is due (the stream was silent for
        the interval). The next event is awaited across pings, never cancelled."""
        it = self.gen.events().__aiter__()
        if self._ping_s is None:
            async for ev in it:
                yield ev
            return
        nxt: asyncio.Future[Event] | None = None
        try:
            while True:
                if nxt is None:
                    nxt = asyncio.ensure_future(it.__anext__())
                done, _ = await asyncio.wait({nxt}, timeout=self._ping_s)
                if not done:
                    yield None
                    continue
                try:
                    ev = nxt.result()
                except StopAsyncIteration:
                    return
                nxt = None
                yield ev
        finally:
            if nxt is not None and not nxt.done():
                nxt.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await nxt
            with contextlib.suppress(Exception):
                await it.aclose()  # type: ignore[attr-defined]

    def progress(self, ev: Event) -> PromptProgress | None:
        """The prompt's progress to send with `ev`: when the request gets its slot (the
        cached tokens are in), and with the first piece (the whole prompt is read)."""
        if not self._progress or self._read:
            return None
        st = self.gen.request.stats
        total = st.prompt_tokens
        if isinstance(ev, Started):
            self._started = time.perf_counter()
            return PromptProgress(
                total=total, cache=ev.cached_tokens, processed=ev.cached_tokens, time_ms=0
            )
        if isinstance(ev, Piece):
            self._read = True
            since = self._started if self._started is not None else self.gen.request.t_submit
            return PromptProgress(
                total=total,
                cache=st.cached_tokens,
                processed=total,
                time_ms=round((time.perf_counter() - since) * 1000),
            )
        return None

    def tick(self, ev: Piece) -> None:
        """`ev` came: when every chunk carries the timings, `now` is them so far."""
        if self.per_token:
            self.now = Timings.of(self.gen.request.stats, predicted_n=ev.n_tokens)


__all__ = ["PING", "LlamaStream"]
