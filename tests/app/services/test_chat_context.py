"""The context made visible, session side, on the real SmolLM2 with a small context: the meter
the engine measures for the prompt it sent (each kind against the prompt actually sent), the
turns it left out marked on screen, every overflow policy sending what the meter announced,
and a summary made once, stored, and reused by the next message.

The engine port here runs each request at once on an `EmbeddedEngine` and hands its events
to the session as the desktop's engine thread does (summary first, then started, the meter,
the text, finished); no Qt.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from app.services.attachments import Attachment, NewAttachment
from app.services.chat_ports import ChatListener, EngineChoice, EngineInfo, Turn
from app.services.chat_session import ChatSession
from app.services.chat_settings import ChatSettings
from app.services.chat_store import ChatStore
from app.services.chat_transcript import PlainTranscript
from engine.host.chat_engine import ChatRequest, EmbeddedEngine
from engine.host.context_meter import ContextMeter, Kind, measure
from engine.host.context_policy import ContextPolicy
from engine.host.runtime import Model
from engine.media.images import decode_image
from engine.native.projector import marker
from engine.rag.grounding import CountTokens, approx_tokens
from engine.rag.search import Hit
from engine.settings import LoadParams, SamplingParams
from tests.media_files import png
from tests.projector_gguf import TOKENS_PER_IMAGE, test_image

N_CTX = 512


@dataclass(frozen=True)
class Loaded:
    path: Path
    name: str = "SmolLM2"
    n_ctx: int = N_CTX
    media: frozenset[str] = frozenset()
    remote: object | None = None

    @property
    def key(self) -> Hashable:
        return self.path


@dataclass
class Sent:
    """One request as the engine ran it: the prompt's tokens and the messages it held."""

    request: ChatRequest
    prompt: list[int]
    messages: list[dict[str, Any]]
    meter: ContextMeter | None


@dataclass
class RealEngine:
    """An `EnginePort` over an `EmbeddedEngine`, run when the test says (`run`)."""

    engine: EmbeddedEngine
    path: Path
    session: ChatSession | None = None
    pending: list[tuple[int, Turn]] = field(default_factory=list)
    sent: list[Sent] = field(default_factory=list)
    requests: int = 0  # every request the engine was asked (answers and summaries)

    def __post_init__(self) -> None:
        reply = self.engine.reply

        def counted(request: ChatRequest, cancel: Any = None) -> Any:
            self.requests += 1
            return reply(request, cancel)

        self.engine.reply = counted  # type: ignore[method-assign]

    def chosen(self, settings: ChatSettings) -> EngineChoice | None:
        return EngineChoice(self.path, "Loading…")

    def start(self, choice: EngineChoice) -> None:
        pass

    def generate(self, turn: Turn) -> int:
        self.pending.append((len(self.sent) + len(self.pending) + 1, turn))
        return self.pending[-1][0]

    def stop(self) -> None: ...
    def cancel_load(self) -> None: ...
    def unload(self) -> None: ...

    def token_counter(self, loaded: EngineInfo) -> CountTokens:
        return approx_tokens

    def media_marker(self) -> str:
        return marker()

    def run(self) -> Sent:
        """Answer the request waiting, as the engine thread does."""
        s = self.session
        assert s is not None
        rid, turn = self.pending.pop(0)
        media = [decode_image(data, name) for _kind, data, name in turn.media]
        request = ChatRequest(
            turn.messages,
            turn.sampling,
            media=media,
            policy=turn.policy,
            continue_text=turn.continue_text,
            continue_thinking=turn.continue_thinking,
            thinking=turn.thinking,
            summary=turn.summary,
            kinds=turn.kinds,
            tails=turn.tails,
        )
        summary = self.engine.summary_for(request)
        if summary is not None:
            request = dataclasses.replace(request, summary=summary)
            s.summarised(rid, summary)
        reply = self.engine.reply(request)
        s.started(rid, reply.prompt_tokens)
        meter = reply.meter(request.kinds, request.tails)
        assert meter is not None
        s.context_meter(rid, meter)
        plan = reply._plan
        assert plan is not None
        text = "".join(reply)
        s.tokens(rid, text, reply.generated_tokens)
        s.finished(rid, reply.stats)
        messages = [dict(x) for x in plan[1].messages]
        out = Sent(request, list(reply.generation.prompt), messages, meter)
        self.sent.append(out)
        return out


class Media:
    """Sent attachments' bytes, in memory."""

    def __init__(self) -> None:
        self.held: dict[str, bytes] = {}

    def keep(self, store: ChatStore | None, new: Sequence[NewAttachment]) -> list[Attachment]:
        out = []
        for n in new:
            key = str(len(self.held))
            self.held[key] = n.data
            out.append(Attachment(key, n.name, n.kind))
        return out

    def data(self, store: ChatStore | None, a: Attachment) -> bytes | None:
        return self.held.get(a.sha256)


class Listener(ChatListener):
    def __init__(self) -> None:
        self.meters: list[ContextMeter | None] = []
        self.summaries: list[str | None] = []
        self.errors: list[str] = []

    def context_meter(self, meter: ContextMeter | None) -> None:
        self.meters.append(meter)

    def summary_changed(self, text: str | None) -> None:
        self.summaries.append(text)

    def error(self, message: str) -> None:
        self.errors.append(message)


class Docs:
    def search(
        self, collections: Sequence[str], query: str, k: int, *, reranker: Path | None = None
    ) -> list[Hit]:
        text = "The lighthouse lamp burned whale oil until 1880, then kerosene."
        return [Hit(1, Path("oil.md"), None, "Lamps", 0, len(text), text, 1.0)]


class Now:
    """Background work run at once (the documents' search)."""

    def run(self, fn: Callable[[], Any], on_done: Any, name: str = "") -> None:
        on_done(fn(), None)


@pytest.fixture(scope="module")
def small_model(smollm2_path: Path) -> Iterator[Model]:
    model = Model(smollm2_path, LoadParams(n_ctx=N_CTX, n_threads=2))
    yield model
    model.close()


@dataclass
class Rig:
    session: ChatSession
    engine: RealEngine
    chat: PlainTranscript
    listener: Listener
    store: ChatStore


@pytest.fixture
def rig(small_model: Model, smollm2_path: Path, tmp_path: Path) -> Iterator[Rig]:
    engine = RealEngine(EmbeddedEngine(small_model), smollm2_path)
    chat = PlainTranscript()
    listener = Listener()
    store = ChatStore(tmp_path / "chats.sqlite3")
    session = ChatSession(
        engine,
        chat,
        Media(),
        sampling=SamplingParams(temperature=0.0, max_tokens=24, seed=1),
        store=store,
        listener=listener,
    )
    engine.session = session
    session.engine_loaded(Loaded(smollm2_path))
    yield Rig(session, engine, chat, listener, store)
    store.close()


def converse(r: Rig, questions: Sequence[str]) -> list[Sent]:
    out = []
    for q in questions:
        assert r.session.send(q), r.listener.errors
        out.append(r.engine.run())
    return out


LONG = [
    f"Question {i}: tell me one fact about lighthouses number {i}, in a few words, "
    "and mention the keeper, the lamp, the lens and the stormy sea around the tower."
    for i in range(1, 9)
]


@pytest.mark.model
def test_the_meter_counts_each_kind_of_the_prompt_sent(rig: Rig) -> None:
    s = rig.session
    s.use_documents(Docs(), Now())
    s.set_settings(ChatSettings(system_prompt="Be brief.", collections=("keeping",)))
    first, second = converse(rig, ["Who keeps the light?", "What did the lamp burn?"])
    engine = rig.engine.engine
    for sent in (first, second):
        m = sent.meter
        assert m is not None
        # Every token of the prompt sent is somebody's, and the listener heard this meter.
        assert sum(m.kinds.values()) == m.prompt_tokens == len(sent.prompt)
        assert m.n_ctx == N_CTX and m.reserve == 24 and m.left_out == ()
        assert m.kinds["system"] > 0 and m.kinds["documents"] > 0 and m.kinds["question"] > 0
    assert rig.listener.meters[-1] == second.meter

    # Each kind against the prompt the engine plans when only that kind changes: the
    # prompt grows or shrinks by what the meter says that kind holds, the others stay.
    m, request = second.meter, second.request
    assert m is not None

    def planned(messages: list[dict[str, Any]], tails: Any = None) -> tuple[int, ContextMeter]:
        plan, _ = engine.plan(dataclasses.replace(request, messages=messages))
        t = request.tails if tails is None else tails
        return len(plan.prompt), measure(engine.model, plan, request.kinds, t)

    msgs = [dict(x) for x in request.messages]
    assert [x["role"] for x in msgs] == ["system", "user", "assistant", "user"]
    assert planned(msgs) == (len(second.prompt), m)  # the same plan as the one sent
    passages = request.tails[0][1]
    no_docs = [{**msgs[0], "content": msgs[0]["content"][: -len(passages)].rstrip()}, *msgs[1:]]
    system_more = [{**msgs[0], "content": "Be brief and kind.\n\n" + passages}, *msgs[1:]]
    question_more = [*msgs[:3], {"role": "user", "content": msgs[3]["content"] + " And why?"}]
    no_history = [msgs[0], msgs[3]]
    variants: list[tuple[Kind, list[dict[str, Any]], Any]] = [
        ("documents", no_docs, {}),
        ("system", system_more, None),
        ("question", question_more, None),
        ("history", no_history, None),
    ]
    for kind, variant, tails in variants:
        n, other = planned(variant, tails)
        assert n - len(second.prompt) == other.kinds[kind] - m.kinds[kind] != 0, kind
        for k in m.kinds:
            if k != kind:
                assert other.kinds[k] == m.kinds[k], (kind, k)


@pytest.mark.model
def test_a_continued_answer_is_counted_too(rig: Rig) -> None:
    (first,) = converse(rig, ["Tell me a long story about a lighthouse keeper."])
    row = len(rig.chat.conversation.messages) - 1
    assert rig.chat.message(row).stats is not None
    assert rig.session.continue_reply(row)
    more = rig.engine.run()
    assert more.request.continue_text
    assert more.meter is not None
    assert sum(more.meter.kinds.values()) == more.meter.prompt_tokens == len(more.prompt)
    assert more.meter.kinds["history"] > first.meter.kinds["history"] if first.meter else False


@pytest.mark.model
def test_an_image_sent_from_the_chat_is_counted_as_attachments(
    smollm2_path: Path, vision_projector_path: Path
) -> None:
    vision = Model(
        smollm2_path, LoadParams(n_ctx=2048, n_threads=2, mmproj=str(vision_projector_path))
    )
    engine = RealEngine(EmbeddedEngine(vision), smollm2_path)
    chat = PlainTranscript()
    session = ChatSession(
        engine, chat, Media(), sampling=SamplingParams(temperature=0.0, max_tokens=4, seed=1)
    )
    engine.session = session
    session.engine_loaded(Loaded(smollm2_path, n_ctx=2048, media=frozenset({"image"})))
    try:
        picture = NewAttachment("sea.png", "image", png(test_image()))
        assert session.send("What is in this picture?", [picture])
        sent = engine.run()
    finally:
        vision.close()
    m = sent.meter
    assert m is not None and len(sent.request.media) == 1
    assert sum(m.kinds.values()) == m.prompt_tokens == len(sent.prompt)
    # The projector's rows for the picture, and the few tokens it wraps them in.
    assert 2 * TOKENS_PER_IMAGE <= m.kinds["attachments"] < 2 * TOKENS_PER_IMAGE + 32
    assert m.kinds["question"] > 0


@pytest.mark.model
def test_tool_results_are_their_own_kind(small_model: Model) -> None:
    engine = EmbeddedEngine(small_model)
    call = {"id": "c1", "type": "function", "function": {"name": "depth", "arguments": "{}"}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "How deep is the harbour?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "name": "depth", "content": "12 metres at low tide"},
    ]
    reply = engine.reply(ChatRequest(messages, SamplingParams(max_tokens=4), policy="stop"))
    meter = reply.meter()
    assert meter is not None
    "".join(reply)
    assert meter.kinds["tool_results"] > 0
    assert sum(meter.kinds.values()) == len(reply.generation.prompt)


@pytest.mark.model
@pytest.mark.parametrize("policy", ["drop_oldest", "truncate_middle", "summarise"])
def test_each_policy_sends_what_the_meter_announced(rig: Rig, policy: ContextPolicy) -> None:
    rig.session.set_settings(ChatSettings(system_prompt="Be brief.", context_policy=policy))
    for q in LONG:  # until the conversation outgrows the context
        last = converse(rig, [q])[0]
        if last.meter is not None and last.meter.left_out:
            break
    m = last.meter
    assert m is not None and m.left_out, "the conversation should outgrow 512 tokens"
    assert sum(m.kinds.values()) == len(last.prompt) and m.prompt_tokens + m.reserve <= N_CTX
    convo = list(last.request.messages)
    announced_absent = set(m.left_out)
    # The messages sent are the conversation's less those announced (the system message
    # carries a summary after its own text; equal answers are counted, not matched).
    sent_contents = Counter(str(x["content"]) for x in last.messages[1:])
    kept = Counter(
        str(x["content"]) for i, x in enumerate(convo) if i and i not in announced_absent
    )
    assert sent_contents == kept and 0 not in announced_absent
    assert str(last.messages[0]["content"]).startswith(convo[0]["content"])
    if policy == "truncate_middle":
        assert 1 not in announced_absent and 2 not in announced_absent  # the first exchange
    # The turns left out are marked on screen, the others are not.
    shown = rig.chat.conversation.messages
    marked = {i for i in range(len(shown)) if rig.chat.left_out(i)}
    sources = [None, *[x.id for x in shown if x.state == "done"]]
    assert marked == {
        next(r for r, x in enumerate(shown) if x.id == sources[i]) for i in announced_absent
    }
    if policy == "summarise":
        assert m.kinds["summary"] > 0


@pytest.mark.model
def test_stop_refuses_and_says_why(rig: Rig) -> None:
    rig.session.set_settings(ChatSettings(context_policy="stop"))
    for q in LONG:
        rig.session.send(q)
        try:
            rig.engine.run()
        except Exception as e:
            assert "context" in str(e)
            return
    pytest.fail("policy stop never refused")


@pytest.mark.model
def test_a_summary_is_stored_and_reused(rig: Rig) -> None:
    s = rig.session
    s.set_settings(ChatSettings(system_prompt="Be brief.", context_policy="summarise"))
    before = 0
    first_summary_at = None
    for i, q in enumerate(LONG):
        before = rig.engine.requests
        assert s.send(q)
        sent = rig.engine.run()
        asked = rig.engine.requests - before
        if first_summary_at is None and asked == 2:
            first_summary_at = i
            stored = rig.store.summary(s.conversation_id or 0)
            assert stored is not None and stored.text and stored.covers
            assert rig.listener.summaries[-1] == stored.text
            break
    assert first_summary_at is not None, "no summary was asked for"
    # The next message: the same summary sent, no new request for one (while it still
    # covers every left-out turn: one more short message keeps it so).
    summary = s.summary
    assert summary is not None
    before = rig.engine.requests
    assert s.send("Thanks.")
    sent = rig.engine.run()
    assert rig.engine.requests - before == 1
    assert sent.request.summary is not None and sent.request.summary.text == summary.text
    assert sent.meter is not None and sent.meter.kinds["summary"] > 0
    # Edited by the person: saved, and sent from the next message on.
    s.edit_summary("The keeper asked about lighthouses; all answered.")
    stored = rig.store.summary(s.conversation_id or 0)
    assert stored is not None and stored.text.startswith("The keeper asked")
    # Opened again: the stored summary comes back, mapped onto the messages.
    cid = s.conversation_id
    assert cid is not None

    def stored_ids(covers: frozenset[str]) -> set[int | None]:
        return {m.store_id for m in rig.chat.conversation.messages if m.id in covers}

    covered = stored_ids(summary.covers)
    assert covered and None not in covered
    s.new_chat()
    s.open_conversation(cid)
    assert s.summary is not None and stored_ids(s.summary.covers) == covered
    assert rig.listener.summaries[-1] == "The keeper asked about lighthouses; all answered."
