"""One planned chat on the shared decode loop, for the Responses and Messages routes: the
generation started like every other route's (same slots, batching, queue limit, metrics) and
its pieces read into thinking, text and tool calls, streamed or whole.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from engine.decoding.reply_reader import Part, ReplyResult
from engine.decoding.tool_calls import ToolCall
from engine.host.chat_plan import ChatPlan
from engine.host.logprobs import TokenLogprob
from engine.host.requests import Finished, Piece
from engine.host.stats import GenerationStats
from engine.server.common import events_until_disconnect, start
from engine.server.engine_state import ServedModel, ServerState
from engine.server.errors import ApiError
from engine.server.reply_logprobs import CONTENT, PartLogprobs
from engine.settings import SamplingParams

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(event: str, data: Any) -> str:
    """A named server-sent event, as both APIs send them (`event:` then `data:`)."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def call_input(call: ToolCall) -> dict[str, Any]:
    """A call's arguments as an object. The generic format's grammar makes them one; a native
    format's call that is not an object keeps its text under one key rather than vanish."""
    try:
        value = json.loads(call.arguments)
    except ValueError:
        value = call.arguments
    return value if isinstance(value, dict) else {"arguments": value}


@dataclass
class Done:
    """A finished reply: what the model said, the figures, and the stop sequence that ended it
    (None unless one did)."""

    reply: ReplyResult
    stats: GenerationStats
    stop_sequence: str | None


class GenerationFailed(Exception):
    """The decode loop reported an error part-way (the stream has started: no HTTP error)."""


class Run:
    def __init__(
        self,
        state: ServerState,
        loaded: ServedModel,
        plan: ChatPlan,
        sampling: SamplingParams,
        *,
        stream: bool,
        logprobs: int | None = None,
    ) -> None:
        self._loaded = loaded
        self._stops = sampling.stop
        self.reader = plan.reader()
        self.done: Done | None = None
        # With `logprobs`: the content's tokens, those of each part last yielded, then all.
        self.follow = None if logprobs is None else PartLogprobs(CONTENT)
        self.part_logprobs: list[tuple[TokenLogprob, ...]] = []
        # Thinking is timed from the pieces, and log probabilities go with them, so they
        # come even when not streamed.
        sampling = plan.sampling(sampling)
        self.gen = start(
            state,
            loaded,
            plan.prompt,
            sampling,
            stream=stream or plan.markers is not None or logprobs is not None,
            media=plan.media,
            logprobs=logprobs,
            thinking=plan.thinking,
        )
        self._pieces = False

    async def whole(self, request: Request) -> Done:
        """The reply read to its end; the generation is cancelled if the client leaves."""
        try:
            async for _ in self._parts(events_until_disconnect(request, self.gen)):
                pass
        except GenerationFailed as e:
            raise ApiError(500, str(e)) from None
        if self.done is None:
            raise ApiError(499, "client closed the request")  # nobody reads this
        return self.done

    def parts(self) -> AsyncIterator[list[Part]]:
        """The reply's parts as they come (for a stream); `done` is set once they end.
        Raises GenerationFailed."""
        return self._parts(self.gen.events())

    async def _parts(self, events: AsyncIterator[Any]) -> AsyncIterator[list[Part]]:
        async for ev in events:
            if isinstance(ev, Piece):
                self._pieces = True
                yield self._follow(self.reader.push(ev.text, ev.n_tokens), ev.logprobs)
            elif isinstance(ev, Finished):
                st = ev.stats
                if st.stop_reason == "error":
                    raise GenerationFailed(st.error or "generation failed")
                if not self._pieces:
                    yield self.reader.push(ev.text, st.gen_tokens)
                tail, reply = self.reader.finish(st)
                yield self._follow(tail, ())
                self.done = Done(reply, st, self._stop_sequence(st))
                return

    def _follow(self, parts: list[Part], lps: tuple[TokenLogprob, ...]) -> list[Part]:
        if self.follow is not None:
            self.part_logprobs = self.follow.push(parts, lps)
        return parts

    def _stop_sequence(self, st: GenerationStats) -> str | None:
        """The stop sequence that ended the reply. The loop holds it back from the text; the
        generated tokens still spell it, and the first one to appear there is the one the
        loop stopped at."""
        if st.stop_reason != "stop_string" or not self._stops:
            return None
        spelled = self._loaded.model.detokenize(self.gen.request.tokens)
        found = [(i, s) for s in self._stops if (i := spelled.find(s)) >= 0]
        return min(found, key=lambda f: f[0])[1] if found else None
