"""OpenAI's Responses API: POST /v1/responses, on the same decode loop as every route.

The input items become chat messages (a function call joins the assistant turn it follows, a
call's output becomes a tool message, a reasoning item goes back as the next assistant turn's
thinking), so the model's own template and the tool formats of chat_reply apply unchanged.
The reply comes back as output items: reasoning (the model's thinking, whole), a message and
function calls. One builder makes the items and their stream events, so a streamed and a
whole answer are the same answer.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engine.decoding import constraints
from engine.decoding.constraints import GrammarError
from engine.decoding.reply_reader import Part
from engine.decoding.tool_calls import ToolChoice
from engine.host.chat_plan import ChatPlan
from engine.server.agent_run import SSE_HEADERS, Done, GenerationFailed, Run, sse
from engine.server.chat_reply import plan_chat
from engine.server.common import cap_tokens, sampling_from
from engine.server.engine_state import ServedModel, ServerState
from engine.server.errors import ApiError
from engine.server.parsing import read_json
from engine.server.protocol.parse import parse_body
from engine.server.protocol.responses import (
    ResponseObject,
    ResponsesFunctionCallItem,
    ResponsesFunctionCallOutputItem,
    ResponsesItem,
    ResponsesMessageItem,
    ResponsesNamedChoice,
    ResponsesReasoningSettings,
    ResponsesRequest,
    ResponsesText,
    ResponsesTextSettings,
    parts_text,
)
from engine.server.response_store import ResponseStore

Json = dict[str, Any]


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def chat_messages(items: str | list[ResponsesItem], convo: list[Json]) -> None:
    """Append the input items to `convo` (chat messages) as the chat template takes them."""
    if isinstance(items, str):
        convo.append({"role": "user", "content": items})
        return
    names = {c["id"]: c["function"]["name"] for m in convo for c in m.get("tool_calls", ())}
    thought = ""  # reasoning items' text, for the assistant turn that follows them
    for item in items:
        if isinstance(item, ResponsesMessageItem):
            role = "system" if item.role == "developer" else item.role
            msg: Json = {"role": role, "content": parts_text(item.content)}
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


def _plan(loaded: ServedModel, req: ResponsesRequest, convo: list[Json]) -> ChatPlan:
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    effort = req.reasoning.effort if req.reasoning else None  # only none/minimal get here
    return plan_chat(
        loaded,
        system + convo,
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
        think=False if effort is not None else None,
    )


class ResponseBuilder:
    """The response object and, as the reply comes, its stream events (sequence-numbered):
    an output item opens when its kind of text starts, closes when another starts or the
    reply ends; function calls come at the end, each as one arguments delta."""

    def __init__(self, response: Json) -> None:
        self.response = response
        self._seq = 0
        self._item: Json | None = None  # the reasoning or message item being written
        self._text: list[str] = []

    def _ev(self, kind: str, **fields: Any) -> Json:
        self._seq += 1
        return {"type": kind, "sequence_number": self._seq - 1, **fields}

    def _where(self) -> Json:
        assert self._item is not None
        return {"item_id": self._item["id"], "output_index": len(self.response["output"]) - 1}

    def start(self) -> list[Json]:
        return [
            self._ev(k, response={**self.response, "output": []})
            for k in ("response.created", "response.in_progress")
        ]

    def push(self, parts: list[Part]) -> list[Json]:
        out: list[Json] = []
        for kind, text in parts:
            want = "reasoning" if kind == "reasoning" else "message"
            if self._item is None or self._item["type"] != want:
                out += self._close("completed")
                out += self._open(want)
            self._text.append(text)
            delta = (
                "response.reasoning_text.delta"
                if want == "reasoning"
                else "response.output_text.delta"
            )
            extra: Json = {} if want == "reasoning" else {"logprobs": []}
            out.append(self._ev(delta, **self._where(), content_index=0, delta=text, **extra))
        return out

    def _open(self, kind: str) -> list[Json]:
        if kind == "reasoning":
            self._item = {
                "type": "reasoning",
                "id": _id("rs"),
                "summary": [],
                "content": [],
                "status": "in_progress",
            }
            part: Json = {"type": "reasoning_text", "text": ""}
        else:
            self._item = {
                "type": "message",
                "id": _id("msg"),
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            part = {"type": "output_text", "text": "", "annotations": []}
        self.response["output"].append(self._item)
        self._text = []
        return [
            self._ev(
                "response.output_item.added",
                output_index=self._where()["output_index"],
                item=dict(self._item),
            ),
            self._ev("response.content_part.added", **self._where(), content_index=0, part=part),
        ]

    def _close(self, status: str) -> list[Json]:
        item = self._item
        if item is None:
            return []
        text = "".join(self._text)
        where = self._where()
        if item["type"] == "reasoning":
            part: Json = {"type": "reasoning_text", "text": text}
            done = self._ev("response.reasoning_text.done", **where, content_index=0, text=text)
        else:
            part = {"type": "output_text", "text": text, "annotations": []}
            done = self._ev(
                "response.output_text.done", **where, content_index=0, text=text, logprobs=[]
            )
        item["content"], item["status"] = [part], status
        self._item = None
        return [
            done,
            self._ev("response.content_part.done", **where, content_index=0, part=part),
            self._ev(
                "response.output_item.done", output_index=where["output_index"], item=dict(item)
            ),
        ]

    def finish(self, done: Done) -> list[Json]:
        st, calls = done.stats, done.reply.calls
        if calls:
            whole = not done.reply.cut_call
        else:  # a forced call's grammar ends only after a call: without one it was cut
            whole = st.stop_reason in ("stop", "stop_string") and not done.reply.forced
        status = "completed" if whole else "incomplete"
        out = self._close(status)
        output = self.response["output"]
        # A forced call's reply is calls only: cut before one was named, it has no item.
        no_message = not any(i["type"] == "message" for i in output)
        if not calls and not done.reply.forced and no_message:
            out += self._open("message") + self._close(status)
        for call in calls:
            item: Json = {
                "type": "function_call",
                "id": _id("fc"),
                "call_id": call.id,
                "name": call.name,
                "arguments": "",
                "status": "in_progress",
            }
            output.append(item)
            where = {"item_id": item["id"], "output_index": len(output) - 1}
            out.append(
                self._ev(
                    "response.output_item.added",
                    output_index=where["output_index"],
                    item=dict(item),
                )
            )
            out.append(
                self._ev("response.function_call_arguments.delta", **where, delta=call.arguments)
            )
            out.append(
                self._ev(
                    "response.function_call_arguments.done",
                    **where,
                    name=call.name,
                    arguments=call.arguments,
                )
            )
            item.update(
                arguments=call.arguments, status="completed" if call.complete else "incomplete"
            )
            out.append(
                self._ev(
                    "response.output_item.done", output_index=where["output_index"], item=dict(item)
                )
            )
        self.response.update(
            status=status,
            completed_at=int(time.time()) if whole else None,
            incomplete_details=None if whole else {"reason": "max_output_tokens"},
            usage={
                "input_tokens": st.prompt_tokens,
                "input_tokens_details": {"cached_tokens": st.cached_tokens},
                "output_tokens": st.gen_tokens,
                "output_tokens_details": {"reasoning_tokens": st.thinking_tokens},
                "total_tokens": st.prompt_tokens + st.gen_tokens,
            },
        )
        kind = "response.completed" if whole else "response.incomplete"
        return [*out, self._ev(kind, response=self.response)]

    def fail(self, message: str) -> list[Json]:
        self.response.update(status="failed", error={"code": "server_error", "message": message})
        return [
            self._ev("error", code="server_error", message=message, param=None),
            self._ev("response.failed", response=self.response),
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
        plan = _plan(loaded, req, convo)
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
        run = Run(self.state, loaded, plan, sampling, stream=stream)
        builder = ResponseBuilder(
            self._response(req, loaded.model_id, sampling.temperature, sampling.top_p)
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
            self.store.put(builder.response["id"], [*convo, turn])

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
            keep(done)
            return JSONResponse(builder.response)

        async def events() -> AsyncIterator[str]:
            for ev in builder.start():
                yield sse(ev["type"], ev)
            try:
                async for parts in run.parts():
                    for ev in builder.push(parts):
                        yield sse(ev["type"], ev)
            except GenerationFailed as e:
                for ev in builder.fail(str(e)):
                    yield sse(ev["type"], ev)
                return
            if run.done is not None:
                for ev in builder.finish(run.done):
                    yield sse(ev["type"], ev)
                keep(run.done)

        return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)

    @staticmethod
    def _response(req: ResponsesRequest, model: str, temperature: float, top_p: float) -> Json:
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
        ).wire()
