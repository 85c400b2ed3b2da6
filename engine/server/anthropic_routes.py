"""Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens, on the same
decode loop as every route (errors in Anthropic's shape, see errors.py).

Content blocks become chat messages: text joins its turn, an assistant's `tool_use` blocks
are its tool calls and `thinking` its reasoning, a user's `tool_result` blocks are tool
messages; consecutive turns of one role are one turn, as Anthropic reads them. The reply
comes back as thinking, text and tool_use blocks; one builder makes the blocks and their
stream events, so a streamed and a whole answer are the same answer.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.decoding import constraints
from engine.decoding.constraints import GrammarError
from engine.decoding.reply_reader import Part
from engine.decoding.tool_calls import ToolChoice
from engine.host.chat_plan import ChatPlan
from engine.native.projector import Media
from engine.server.agent_run import SSE_HEADERS, Done, GenerationFailed, Run, call_input, sse
from engine.server.chat_reply import answer_reserve, fitted_plan, left_out_headers, plan_chat
from engine.server.common import cap_tokens, sampling_from
from engine.server.engine_state import ServedModel, ServerState
from engine.server.errors import ApiError, anthropic_error_body
from engine.server.media_parts import decode_media
from engine.server.parsing import read_json
from engine.server.protocol.anthropic import (
    AnthropicBlockDelta,
    AnthropicBlockStart,
    AnthropicBlockStop,
    AnthropicCountTokensRequest,
    AnthropicImageBlock,
    AnthropicInputDelta,
    AnthropicMessageDelta,
    AnthropicMessagesRequest,
    AnthropicMessageStart,
    AnthropicMessageStop,
    AnthropicReply,
    AnthropicReplyText,
    AnthropicReplyThinking,
    AnthropicReplyToolUse,
    AnthropicStop,
    AnthropicTextBlock,
    AnthropicTextDelta,
    AnthropicThinkingBlock,
    AnthropicThinkingDelta,
    AnthropicTokenCount,
    AnthropicToolResultBlock,
    AnthropicToolUseBlock,
    AnthropicUsage,
    StopReason,
)
from engine.server.protocol.base import HOLE, Template
from engine.server.protocol.media import MediaPart, media_text
from engine.server.protocol.parse import parse_body

Json = dict[str, Any]
_STOP_REASONS: dict[str, StopReason] = {
    "stop": "end_turn",
    "stop_string": "stop_sequence",
    "context_full": "model_context_window_exceeded",
}


def _add(out: list[Json], msg: Json) -> None:
    """Append a turn, joining it to the previous one of the same role."""
    last = out[-1] if out else None
    if last is None or last["role"] != msg["role"] or msg["role"] not in ("user", "assistant"):
        out.append(msg)
        return
    last["content"] = "\n\n".join(c for c in (last["content"], msg["content"]) if c)
    if "reasoning_content" in msg:
        last["reasoning_content"] = last.get("reasoning_content", "") + msg["reasoning_content"]
    if "tool_calls" in msg:
        last.setdefault("tool_calls", []).extend(msg["tool_calls"])


def chat_messages(
    req: AnthropicCountTokensRequest, media: list[MediaPart] | None = None
) -> list[Json]:
    """The conversation as chat messages; each image block is its marker in the text, and
    its part is appended to `media` in the same order."""
    media = [] if media is None else media
    out: list[Json] = []
    if req.system:
        system = (
            req.system if isinstance(req.system, str) else "\n\n".join(b.text for b in req.system)
        )
        out.append({"role": "system", "content": system})
    names: dict[str, str] = {}  # tool_use id -> tool name, for the results
    for i, m in enumerate(req.messages):
        blocks = (
            [AnthropicTextBlock(type="text", text=m.content)]
            if isinstance(m.content, str)
            else m.content
        )
        allowed = (
            (AnthropicTextBlock, AnthropicImageBlock, AnthropicToolResultBlock)
            if m.role == "user"
            else (AnthropicTextBlock, AnthropicToolUseBlock, AnthropicThinkingBlock)
        )
        texts: list[str] = []
        turn: Json = {"role": m.role}
        for j, b in enumerate(blocks):
            if not isinstance(b, allowed):
                raise ApiError(
                    400,
                    f"'messages[{i}]': a {m.role} message cannot hold {b.type} blocks",
                    param="messages",
                )
            if isinstance(b, AnthropicTextBlock):
                texts.append(b.text)
            elif isinstance(b, AnthropicImageBlock):
                texts.append(media_text())
                media.append(b.media(f"messages[{i}].content[{j}]"))
            elif isinstance(b, AnthropicThinkingBlock):
                turn["reasoning_content"] = turn.get("reasoning_content", "") + b.thinking
            elif isinstance(b, AnthropicToolUseBlock):
                names[b.id] = b.name
                turn.setdefault("tool_calls", []).append(
                    {
                        "id": b.id,
                        "type": "function",
                        "function": {
                            "name": b.name,
                            "arguments": json.dumps(b.input, ensure_ascii=False),
                        },
                    }
                )
            elif isinstance(b, AnthropicToolResultBlock):
                if texts:  # text before a result is a turn of its own
                    _add(out, {"role": "user", "content": "\n".join(texts)})
                    texts = []
                result: Json = {
                    "role": "tool",
                    "tool_call_id": b.tool_use_id,
                    "content": f"Error: {b.text}" if b.is_error else b.text,
                }
                if b.tool_use_id in names:
                    result["name"] = names[b.tool_use_id]
                out.append(result)
        if texts or len(turn) > 1 or not blocks:
            _add(out, {**turn, "content": "\n".join(texts)})
    return out


def _choice(req: AnthropicCountTokensRequest) -> tuple[ToolChoice, bool]:
    """The tool choice and whether calls may come several at once."""
    c = req.tool_choice
    if c is None:
        return ("auto" if req.tools else "none"), True
    choice = {"auto": "auto", "any": "required", "none": "none"}.get(c.type, c.name or "")
    return choice, not c.disable_parallel_tool_use


def _plan(
    loaded: ServedModel,
    req: AnthropicCountTokensRequest,
    messages: list[Json],
    media: Sequence[Media] = (),
) -> ChatPlan:
    return plan_chat(loaded, messages, **_plan_args(req, media))


def _plan_args(req: AnthropicCountTokensRequest, media: Sequence[Media]) -> dict[str, Any]:
    """What plan_chat takes from the request, besides the model and the messages."""
    fmt = req.output_config.format if req.output_config else None
    grammar = None
    if fmt is not None:
        try:
            grammar = constraints.json_schema(fmt.schema_, what="the schema")
        except GrammarError as e:
            raise ApiError(400, f"'output_config.format': {e}", param="output_config") from None
    choice, parallel = _choice(req)
    return dict(
        tools=[
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "parameters": t.input_schema,
                    **({"description": t.description} if t.description else {}),
                },
            }
            for t in req.tools or []
        ],
        choice=choice,
        parallel=parallel,
        grammar=grammar,
        grammar_param="output_config",
        think=False if req.thinking and req.thinking.type == "disabled" else None,
        media=media,
        budget=req.thinking.budget_tokens if req.thinking else None,
    )


# A stream event: its name and its data's JSON text.
Event = tuple[str, str]


def _dumps(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False)


def _event(
    ev: AnthropicMessageStart
    | AnthropicBlockStart
    | AnthropicBlockDelta
    | AnthropicBlockStop
    | AnthropicMessageDelta
    | AnthropicMessageStop,
) -> Event:
    """An event named by its type, its data made now (the message goes on changing)."""
    return ev.type, _dumps(ev.wire())


class MessageBuilder:
    """The message and, as the reply comes, its stream events: a block opens when its kind of
    text starts and stops when another starts or the reply ends; tool_use blocks come at the
    end, each with its whole input as one JSON delta. Events are the protocol's models, sent
    as their wire form when made (the message goes on changing)."""

    def __init__(self, message: AnthropicReply) -> None:
        self.message = message
        self._block: AnthropicReplyText | AnthropicReplyThinking | None = None  # being written
        self._text: list[str] = []
        self._delta: Template | None = None  # the open block's delta event, checked once

    def start(self) -> list[Event]:
        opening = self.message.model_copy(update={"content": []})
        return [_event(AnthropicMessageStart(type="message_start", message=opening))]

    def push(self, parts: list[Part]) -> list[Event]:
        out: list[Event] = []
        for kind, text in parts:
            want = "thinking" if kind == "reasoning" else "text"
            if self._block is None or self._block.type != want:
                out += self._stop()
                out += self._open(want)
            self._text.append(text)
            assert self._delta is not None
            out.append(("content_block_delta", self._delta.fill(text)))  # per token
        return out

    def _index(self) -> int:
        return len(self.message.content) - 1

    def _open(self, kind: str) -> list[Event]:
        block: AnthropicReplyText | AnthropicReplyThinking = (
            AnthropicReplyThinking(type="thinking", thinking="", signature="")
            if kind == "thinking"
            else AnthropicReplyText(type="text", text="")
        )
        self._block, self._text = block, []
        self.message.content.append(block)
        i = self._index()
        delta: AnthropicTextDelta | AnthropicThinkingDelta = (
            AnthropicThinkingDelta(type="thinking_delta", thinking=HOLE)
            if kind == "thinking"
            else AnthropicTextDelta(type="text_delta", text=HOLE)
        )
        event = AnthropicBlockDelta(type="content_block_delta", index=i, delta=delta)
        self._delta = Template(event, _dumps)
        started = AnthropicBlockStart(type="content_block_start", index=i, content_block=block)
        return [_event(started)]

    def _stop(self) -> list[Event]:
        if self._block is None:
            return []
        text = "".join(self._text)
        if isinstance(self._block, AnthropicReplyThinking):
            self._block.thinking = text
        else:
            self._block.text = text
        self._block = self._delta = None
        stop = AnthropicBlockStop(type="content_block_stop", index=self._index())
        return [_event(stop)]

    def finish(self, done: Done) -> list[Event]:
        st, calls = done.stats, done.reply.calls
        out = self._stop()
        content = self.message.content
        text = any(isinstance(b, AnthropicReplyText) for b in content)
        if not calls and not done.reply.forced and not text:
            out += self._open("text") + self._stop()
        for call in calls:
            args = call_input(call)
            block = AnthropicReplyToolUse(
                type="tool_use",
                id="toolu_" + call.id.removeprefix("call_"),
                name=call.name,
                input={},
            )
            content.append(block)
            i = self._index()
            partial = AnthropicInputDelta(type="input_json_delta", partial_json=json.dumps(args))
            out += [
                _event(
                    AnthropicBlockStart(type="content_block_start", index=i, content_block=block)
                ),
                _event(AnthropicBlockDelta(type="content_block_delta", index=i, delta=partial)),
                _event(AnthropicBlockStop(type="content_block_stop", index=i)),
            ]
            block.input = args
        # A tool_use block the token limit cut ends the message as max_tokens does.
        whole_calls = bool(calls) and not done.reply.cut_call
        reason: StopReason = (
            "tool_use" if whole_calls else _STOP_REASONS.get(st.stop_reason, "max_tokens")
        )
        usage = AnthropicUsage(
            input_tokens=st.prompt_tokens - st.cached_tokens,
            cache_read_input_tokens=st.cached_tokens,
            cache_creation_input_tokens=0,
            output_tokens=st.gen_tokens,
        )
        stop_sequence = done.stop_sequence if reason == "stop_sequence" else None
        self.message.stop_reason = reason
        self.message.stop_sequence = stop_sequence
        self.message.usage = usage
        stop = AnthropicStop(stop_reason=reason, stop_sequence=stop_sequence)
        return [
            *out,
            _event(AnthropicMessageDelta(type="message_delta", delta=stop, usage=usage)),
            _event(AnthropicMessageStop(type="message_stop")),
        ]


class AnthropicRoutes:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    def routes(self) -> list[Route]:
        return [
            Route("/v1/messages", self.create, methods=["POST"]),
            Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"]),
        ]

    async def count_tokens(self, request: Request) -> Response:
        body = await read_json(request, self.state.config.max_body_bytes)
        req = parse_body(AnthropicCountTokensRequest, body)
        loaded = await self.state.acquire(req.model)
        parts: list[MediaPart] = []
        messages = chat_messages(req, parts)
        plan = _plan(loaded, req, messages, await decode_media(loaded, parts))
        return JSONResponse(AnthropicTokenCount(input_tokens=len(plan.prompt)).wire())

    async def create(self, request: Request) -> Response:
        body = await read_json(request, self.state.config.max_body_bytes)
        req = parse_body(AnthropicMessagesRequest, body)
        loaded = await self.state.acquire(req.model)
        parts: list[MediaPart] = []
        messages = chat_messages(req, parts)
        if messages[-1]["role"] == "assistant":
            raise ApiError(
                400,
                "'messages': the last message must be the user's (text or "
                "tool results); continuing a prefilled assistant turn is not "
                "supported",
                param="messages",
            )
        plan = await fitted_plan(
            request,
            self.state,
            loaded,
            messages,
            policy=req.context_policy,
            reserve=answer_reserve(loaded, cap_tokens(self.state, req.max_tokens)),
            **_plan_args(req, await decode_media(loaded, parts)),
        )
        sampling = sampling_from(
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            min_p=None,
            repeat_penalty=None,
            seed=None,
            max_tokens=cap_tokens(self.state, req.max_tokens),
            stop=tuple(req.stop_sequences or ()),
        )
        stream = bool(req.stream)
        run = Run(self.state, loaded, plan, sampling, stream=stream)
        builder = MessageBuilder(
            AnthropicReply(
                id=f"msg_{uuid.uuid4().hex[:24]}",
                type="message",
                role="assistant",
                model=loaded.model_id,
                content=[],
                stop_reason=None,
                stop_sequence=None,
                usage=AnthropicUsage(input_tokens=len(plan.prompt), output_tokens=0),
            )
        )
        if not stream:
            done = await run.whole(request)
            builder.push(
                [
                    p
                    for p in (("reasoning", done.reply.reasoning), ("content", done.reply.content))
                    if p[1]
                ]
            )
            builder.finish(done)
            return JSONResponse(
                builder.message.wire(), headers=left_out_headers(plan, req.context_policy)
            )

        def lines(events: list[Event]) -> Iterator[str]:
            for name, data in events:
                yield f"event: {name}\ndata: {data}\n\n"

        async def events() -> AsyncIterator[str]:
            for line in lines(builder.start()):
                yield line
            try:
                async for parts in run.parts():
                    for line in lines(builder.push(parts)):
                        yield line
            except GenerationFailed as e:
                yield sse("error", anthropic_error_body(500, str(e)))
                return
            if run.done is not None:
                for line in lines(builder.finish(run.done)):
                    yield line

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers=left_out_headers(plan, req.context_policy, SSE_HEADERS),
        )
