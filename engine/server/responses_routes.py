"""OpenAI's Responses API: POST /v1/responses, on the same decode loop as every route.

The input items become chat messages (a function call joins the assistant turn it follows, a
call's output becomes a tool message, a reasoning item goes back as the next assistant turn's
thinking), so the model's own template and the tool formats of chat_reply apply unchanged.
The reply comes back as output items: reasoning (the model's thinking, whole), a message and
function calls. One builder makes the items and their stream events, so a streamed and a
whole answer are the same answer.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.decoding import constraints
from engine.decoding.constraints import GrammarError
from engine.decoding.reply_reader import Part
from engine.decoding.tool_calls import ToolChoice
from engine.host.chat_plan import ChatPlan
from engine.host.logprobs import TokenLogprob
from engine.native.projector import Media
from engine.server.agent_run import SSE_HEADERS, Done, GenerationFailed, Run
from engine.server.chat_reply import answer_reserve, fitted_plan, left_out_headers
from engine.server.common import cap_tokens, sampling_from
from engine.server.engine_state import ServedModel, ServerState
from engine.server.errors import ApiError
from engine.server.media_parts import decode_media
from engine.server.parsing import read_json
from engine.server.protocol.base import HOLE, Reply, Template
from engine.server.protocol.logprobs import entries
from engine.server.protocol.media import MediaPart
from engine.server.protocol.parse import parse_body
from engine.server.protocol.responses import (
    ResponseObject,
    ResponsesArgumentsDelta,
    ResponsesArgumentsDone,
    ResponsesError,
    ResponsesErrorEvent,
    ResponsesFunctionCallItem,
    ResponsesFunctionCallOutputItem,
    ResponsesItem,
    ResponsesItemEvent,
    ResponsesMessageItem,
    ResponsesNamedChoice,
    ResponsesOutputFunctionCall,
    ResponsesOutputMessage,
    ResponsesOutputReasoning,
    ResponsesOutputText,
    ResponsesPartEvent,
    ResponsesReasoningSettings,
    ResponsesReasoningText,
    ResponsesRequest,
    ResponsesStateEvent,
    ResponsesText,
    ResponsesTextDelta,
    ResponsesTextDone,
    ResponsesTextSettings,
    ResponsesUsage,
    parts_media,
    parts_text,
)
from engine.server.response_store import ResponseStore

Json = dict[str, Any]


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


MEDIA = "_media"  # a message's images, kept with it in the store (see `media_parts`)


def chat_messages(items: str | list[ResponsesItem], convo: list[Json]) -> None:
    """Append the input items to `convo` (chat messages) as the chat template takes them.
    A message's images are their markers in its text and, under MEDIA, their parts (as
    JSON, so that the store keeps them for `previous_response_id`)."""
    if isinstance(items, str):
        convo.append({"role": "user", "content": items})
        return
    names = {c["id"]: c["function"]["name"] for m in convo for c in m.get("tool_calls", ())}
    thought = ""  # reasoning items' text, for the assistant turn that follows them
    for k, item in enumerate(items):
        if isinstance(item, ResponsesMessageItem):
            role = "system" if item.role == "developer" else item.role
            msg: Json = {"role": role, "content": parts_text(item.content)}
            if parts := parts_media(item.content, f"input[{k}].content"):
                msg[MEDIA] = [p.stored() for p in parts]
            if role == "assistant" and thought:
                msg["reasoning_content"], thought = thought, ""
            convo.append(msg)
        elif isinstance(item, ResponsesFunctionCallItem):
            names[item.call_id] = item.name
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            if convo and convo[-1]["role"] == "assistant":  # the same turn's calls
                convo[-1].setdefault("tool_calls", []).append(call)
            else:
                msg = {"role": "assistant", "content": "", "tool_calls": [call]}
                if thought:
                    msg["reasoning_content"], thought = thought, ""
                convo.append(msg)
        elif isinstance(item, ResponsesFunctionCallOutputItem):
            result: Json = {
                "role": "tool",
                "tool_call_id": item.call_id,
                "content": parts_text(item.output),
            }
            if item.call_id in names:
                result["name"] = names[item.call_id]
            convo.append(result)
        else:
            thought += item.text


def _grammar(text: ResponsesText | None) -> str | None:
    fmt = text.format if text else None
    try:
        if fmt is not None and fmt.type == "json_object":
            return constraints.any_json_object()
        if fmt is not None and fmt.type == "json_schema":
            return constraints.json_schema(fmt.schema_, what="the schema")
    except GrammarError as e:
        raise ApiError(400, f"'text.format': {e}", param="text") from None
    return None


def _choice(req: ResponsesRequest) -> ToolChoice:
    c = req.tool_choice
    if isinstance(c, ResponsesNamedChoice):
        return c.name
    return c or ("auto" if req.tools else "none")


def media_parts(convo: list[Json]) -> list[MediaPart]:
    """The images of the conversation, in the order of their markers."""
    return [MediaPart.from_stored(p) for m in convo for p in m.get(MEDIA, ())]


async def _plan(
    request: Request,
    state: ServerState,
    loaded: ServedModel,
    req: ResponsesRequest,
    convo: list[Json],
    media: Sequence[Media] = (),
) -> ChatPlan:
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    convo = [{k: v for k, v in m.items() if k != MEDIA} for m in convo]
    effort = req.reasoning.effort if req.reasoning else None
    return await fitted_plan(
        request,
        state,
        loaded,
        system + convo,
        policy=req.context_policy,
        reserve=answer_reserve(loaded, cap_tokens(state, req.max_output_tokens)),
        tools=[
            {
                "type": "function",
                "function": t.model_dump(
                    include={"name", "description", "parameters"}, exclude_none=True
                ),
            }
            for t in req.tools or []
        ],
        choice=_choice(req),
        parallel=req.parallel_tool_calls is not False,
        grammar=_grammar(req.text),
        grammar_param="text",
        think=None,
        effort=effort,
        media=media,
        media_param="input",
    )


# A stream event: its name and its data's JSON text.
Event = tuple[str, str]
Status = Literal["completed", "incomplete"]


def _dumps(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False)


class ResponseBuilder:
    """The response object and, as the reply comes, its stream events (sequence-numbered):
    an output item opens when its kind of text starts, closes when another starts or the
    reply ends; function calls come at the end, each as one arguments delta. Events are the
    protocol's models, sent as their wire form when made (the response goes on changing)."""

    def __init__(self, response: ResponseObject, *, logprobs: bool = False) -> None:
        self.response = response
        self._seq = 0
        self._item: ResponsesOutputReasoning | ResponsesOutputMessage | None = None
        self._text: list[str] = []
        self._delta: Template | None = None  # the open item's delta event, checked once
        self._logprobs = logprobs  # the message text's log probabilities were asked for
        self._lps: list[TokenLogprob] = []  # the open message's tokens

    def _ev(self, event: Reply) -> Event:
        """`event` (made with sequence_number 0) numbered next, as sent."""
        data = event.wire()
        data["sequence_number"] = self._next()
        return str(data["type"]), _dumps(data)

    def _next(self) -> int:
        self._seq += 1
        return self._seq - 1

    def _index(self) -> int:
        return len(self.response.output) - 1

    def start(self) -> list[Event]:
        opening = self.response.model_copy(update={"output": []})
        return [
            self._ev(ResponsesStateEvent(type=k, sequence_number=0, response=opening))
            for k in ("response.created", "response.in_progress")
        ]

    def push(self, parts: list[Part], own: Sequence[tuple[TokenLogprob, ...]] = ()) -> list[Event]:
        """The events of `parts`; `own`: each part's tokens, when log probabilities were
        asked for (agent_run.Run.part_logprobs)."""
        out: list[Event] = []
        for k, (kind, text) in enumerate(parts):
            want = "reasoning" if kind == "reasoning" else "message"
            if self._item is None or self._item.type != want:
                out += self._close("completed")
                out += self._open(want)
            self._text.append(text)
            if self._logprobs and want == "message":
                out.append(self._text_delta(text, own[k] if k < len(own) else ()))
                continue
            assert self._delta is not None
            name = (
                "response.reasoning_text.delta"
                if want == "reasoning"
                else ("response.output_text.delta")
            )
            out.append((name, self._delta.fill(self._next(), text)))  # per token
        return out

    def _text_delta(self, text: str, lps: tuple[TokenLogprob, ...]) -> Event:
        """A delta of the message's text with its tokens' log probabilities."""
        assert self._item is not None
        self._lps += lps
        delta = ResponsesTextDelta(
            type="response.output_text.delta",
            sequence_number=0,
            item_id=self._item.id,
            output_index=self._index(),
            content_index=0,
            delta=text,
            logprobs=entries(lps),
        )
        return self._ev(delta)

    def _open(self, kind: str) -> list[Event]:
        item: ResponsesOutputReasoning | ResponsesOutputMessage
        part: ResponsesReasoningText | ResponsesOutputText
        if kind == "reasoning":
            item = ResponsesOutputReasoning(
                type="reasoning", id=_id("rs"), summary=[], content=[], status="in_progress"
            )
            part = ResponsesReasoningText(type="reasoning_text", text="")
        else:
            item = ResponsesOutputMessage(
                type="message", id=_id("msg"), role="assistant", status="in_progress", content=[]
            )
            part = ResponsesOutputText(type="output_text", text="", annotations=[])
        self.response.output.append(item)
        self._item, self._text, self._lps = item, [], []
        i = self._index()
        delta = ResponsesTextDelta(
            type="response.reasoning_text.delta"
            if kind == "reasoning"
            else "response.output_text.delta",
            sequence_number=0,
            item_id=item.id,
            output_index=i,
            content_index=0,
            delta=HOLE,
        )
        if kind != "reasoning":
            delta.logprobs = []
        self._delta = Template(delta, _dumps, keys=("sequence_number",))
        return [
            self._ev(
                ResponsesItemEvent(
                    type="response.output_item.added", sequence_number=0, output_index=i, item=item
                )
            ),
            self._ev(
                ResponsesPartEvent(
                    type="response.content_part.added",
                    sequence_number=0,
                    item_id=item.id,
                    output_index=i,
                    content_index=0,
                    part=part,
                )
            ),
        ]

    def _close(self, status: Status) -> list[Event]:
        item = self._item
        if item is None:
            return []
        text = "".join(self._text)
        i = self._index()
        part: ResponsesReasoningText | ResponsesOutputText
        done = ResponsesTextDone(
            type="response.output_text.done",
            sequence_number=0,
            item_id=item.id,
            output_index=i,
            content_index=0,
            text=text,
        )
        if isinstance(item, ResponsesOutputReasoning):
            part = ResponsesReasoningText(type="reasoning_text", text=text)
            item.content = [part]
            done.type = "response.reasoning_text.done"
        else:
            part = ResponsesOutputText(type="output_text", text=text, annotations=[])
            done.logprobs = []
            if self._logprobs:
                part.logprobs = done.logprobs = entries(self._lps)
            item.content = [part]
        item.status = status
        self._item = self._delta = None
        return [
            self._ev(done),
            self._ev(
                ResponsesPartEvent(
                    type="response.content_part.done",
                    sequence_number=0,
                    item_id=item.id,
                    output_index=i,
                    content_index=0,
                    part=part,
                )
            ),
            self._ev(
                ResponsesItemEvent(
                    type="response.output_item.done", sequence_number=0, output_index=i, item=item
                )
            ),
        ]

    def finish(self, done: Done) -> list[Event]:
        st, calls = done.stats, done.reply.calls
        if calls:
            whole = not done.reply.cut_call
        else:  # a forced call's grammar ends only after a call: without one it was cut
            whole = st.stop_reason in ("stop", "stop_string") and not done.reply.forced
        status: Status = "completed" if whole else "incomplete"
        out = self._close(status)
        output = self.response.output
        # A forced call's reply is calls only: cut before one was named, it has no item.
        no_message = not any(i.type == "message" for i in output)
        if not calls and not done.reply.forced and no_message:
            out += self._open("message") + self._close(status)
        for call in calls:
            item = ResponsesOutputFunctionCall(
                type="function_call",
                id=_id("fc"),
                call_id=call.id,
                name=call.name,
                arguments="",
                status="in_progress",
            )
            output.append(item)
            i = self._index()
            out.append(
                self._ev(
                    ResponsesItemEvent(
                        type="response.output_item.added",
                        sequence_number=0,
                        output_index=i,
                        item=item,
                    )
                )
            )
            out.append(
                self._ev(
                    ResponsesArgumentsDelta(
                        type="response.function_call_arguments.delta",
                        sequence_number=0,
                        item_id=item.id,
                        output_index=i,
                        delta=call.arguments,
                    )
                )
            )
            out.append(
                self._ev(
                    ResponsesArgumentsDone(
                        type="response.function_call_arguments.done",
                        sequence_number=0,
                        item_id=item.id,
                        output_index=i,
                        name=call.name,
                        arguments=call.arguments,
                    )
                )
            )
            item.arguments = call.arguments
            item.status = "completed" if call.complete else "incomplete"
            out.append(
                self._ev(
                    ResponsesItemEvent(
                        type="response.output_item.done",
                        sequence_number=0,
                        output_index=i,
                        item=item,
                    )
                )
            )
        r = self.response
        r.status = status
        r.completed_at = int(time.time()) if whole else None
        r.incomplete_details = None if whole else {"reason": "max_output_tokens"}
        r.usage = ResponsesUsage(
            input_tokens=st.prompt_tokens,
            input_tokens_details={"cached_tokens": st.cached_tokens},
            output_tokens=st.gen_tokens,
            output_tokens_details={"reasoning_tokens": st.thinking_tokens},
            total_tokens=st.prompt_tokens + st.gen_tokens,
        )
        kind: Literal["response.completed", "response.incomplete"] = (
            "response.completed" if whole else "response.incomplete"
        )
        return [*out, self._ev(ResponsesStateEvent(type=kind, sequence_number=0, response=r))]

    def fail(self, message: str) -> list[Event]:
        self.response.status = "failed"
        self.response.error = ResponsesError(code="server_error", message=message)
        return [
            self._ev(
                ResponsesErrorEvent(
                    type="error",
                    sequence_number=0,
                    code="server_error",
                    message=message,
                    param=None,
                )
            ),
            self._ev(
                ResponsesStateEvent(
                    type="response.failed", sequence_number=0, response=self.response
                )
            ),
        ]


class ResponsesRoutes:
    def __init__(self, state: ServerState, store: ResponseStore | None = None) -> None:
        self.state = state
        self.store = store or ResponseStore()

    def routes(self) -> list[Route]:
        return [Route("/v1/responses", self.create, methods=["POST"])]

    def _history(self, req: ResponsesRequest) -> list[Json]:
        rid = req.previous_response_id
        if rid is None:
            return []
        history = self.store.get(rid)
        if history is None:
            raise ApiError(
                400,
                f"previous response '{rid}' is not in this server's store: it "
                f"keeps the last {self.store.max_responses} responses in memory "
                "(not those made with store=false, none after a restart) and is "
                "stateless otherwise; send the whole conversation in 'input'",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        return history

    async def create(self, request: Request) -> Response:
        body = await read_json(request, self.state.config.max_body_bytes)
        req = parse_body(ResponsesRequest, body)
        loaded = await self.state.acquire(req.model)
        convo = self._history(req)
        chat_messages(req.input, convo)
        if not convo:
            raise ApiError(400, "'input' is empty", param="input")
        media = await decode_media(loaded, media_parts(convo))
        plan = await _plan(request, self.state, loaded, req, convo, media)
        sampling = sampling_from(
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=None,
            min_p=None,
            repeat_penalty=None,
            seed=None,
            stop=(),
            max_tokens=cap_tokens(self.state, req.max_output_tokens),
        )
        stream = bool(req.stream)
        want = req.asked_logprobs()
        run = Run(self.state, loaded, plan, sampling, stream=stream, logprobs=want)
        builder = ResponseBuilder(
            self._response(req, loaded.model_id, sampling.temperature, sampling.top_p),
            logprobs=want is not None,
        )

        def keep(done: Done) -> None:
            if req.store is False:
                return
            reply = done.reply
            turn: Json = {"role": "assistant", "content": reply.content}
            if reply.reasoning:
                turn["reasoning_content"] = reply.reasoning
            if reply.calls:
                turn["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for c in reply.calls
                ]
            self.store.put(builder.response.id, [*convo, turn])

        if not stream:
            done = await run.whole(request)
            taken = tuple(run.follow.taken) if run.follow is not None else ()
            whole: list[tuple[Part, tuple[TokenLogprob, ...]]] = [
                (("reasoning", done.reply.reasoning), ()),
                (("content", done.reply.content), taken),
            ]
            shown = [(p, lps) for p, lps in whole if p[1]]
            builder.push([p for p, _ in shown], [lps for _, lps in shown])
            builder.finish(done)
            keep(done)
            return JSONResponse(
                builder.response.wire(), headers=left_out_headers(plan, req.context_policy)
            )

        def lines(events: list[Event]) -> Iterator[str]:
            for name, data in events:
                yield f"event: {name}\ndata: {data}\n\n"

        async def events() -> AsyncIterator[str]:
            for line in lines(builder.start()):
                yield line
            try:
                async for parts in run.parts():
                    for line in lines(builder.push(parts, run.part_logprobs)):
                        yield line
            except GenerationFailed as e:
                for line in lines(builder.fail(str(e))):
                    yield line
                return
            if run.done is not None:
                for line in lines(builder.finish(run.done)):
                    yield line
                keep(run.done)

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers=left_out_headers(plan, req.context_policy, SSE_HEADERS),
        )

    @staticmethod
    def _response(
        req: ResponsesRequest, model: str, temperature: float, top_p: float
    ) -> ResponseObject:
        """The response object before the reply: the request's settings as they apply."""
        c = req.tool_choice
        fmt = req.text.format if req.text else None
        return ResponseObject(
            id=_id("resp"),
            object="response",
            created_at=int(time.time()),
            status="in_progress",
            error=None,
            incomplete_details=None,
            model=model,
            output=[],
            usage=None,
            instructions=req.instructions,
            previous_response_id=req.previous_response_id,
            tools=[t.model_dump(by_alias=True) for t in req.tools or []],
            tool_choice=c.model_dump() if isinstance(c, ResponsesNamedChoice) else _choice(req),
            parallel_tool_calls=req.parallel_tool_calls is not False,
            temperature=temperature,
            top_p=top_p,
            max_output_tokens=req.max_output_tokens,
            text=ResponsesTextSettings(
                format=fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}
            ),
            reasoning=ResponsesReasoningSettings(
                effort=req.reasoning.effort if req.reasoning else None, summary=None
            ),
            truncation="disabled",
            store=req.store is not False,
            background=False,
            metadata=req.metadata or {},
            user=req.user,
        )
