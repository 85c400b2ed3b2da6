"""The chat's session without Qt: a scripted engine port, a plain transcript, the real chat
store. Each test drives the engine's events by hand, so every step of the pipeline (load ->
retrieve -> tools -> stream) and every ending is taken in a known order.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from app.services.attachments import Attachment, NewAttachment
from app.services.chat_ports import ChatListener, EngineChoice, EngineInfo, Turn
from app.services.chat_reply import ReplyState
from app.services.chat_session import ChatSession
from app.services.chat_settings import ChatSettings, EngineBinding
from app.services.chat_store import ChatStore
from app.services.chat_tools import OfferedTool, ToolLoop
from app.services.chat_transcript import PlainTranscript
from engine.host.context_policy import ContextFullError, fit_messages
from engine.host.stats import GenerationStats
from engine.rag.grounding import CountTokens, approx_tokens
from engine.rag.search import Hit

MODEL = Path("fake-model.gguf")


@dataclass(frozen=True)
class Loaded:
    name: str = "Fake Model"
    n_ctx: int = 2048
    media: frozenset[str] = frozenset()
    remote: object | None = None
    path: Path = MODEL

    @property
    def key(self) -> Hashable:
        return self.path


@dataclass
class FakeEngine:
    """An `EnginePort` that records what the session asks of it."""

    choice: EngineChoice | None = field(default_factory=lambda: EngineChoice(MODEL, "Loading…"))
    started: list[EngineChoice] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    stops: int = 0
    load_cancels: int = 0

    def chosen(self, settings: ChatSettings) -> EngineChoice | None:
        return self.choice

    def start(self, choice: EngineChoice) -> None:
        self.started.append(choice)

    def generate(self, turn: Turn) -> int:
        self.turns.append(turn)
        return len(self.turns)

    def stop(self) -> None:
        self.stops += 1

    def cancel_load(self) -> None:
        self.load_cancels += 1

    def unload(self) -> None:
        pass

    def token_counter(self, loaded: EngineInfo) -> CountTokens:
        return approx_tokens

    def media_marker(self) -> str:
        return "<media>"


class Media:
    def __init__(self) -> None:
        self.held: dict[str, bytes] = {}

    def keep(self, store: ChatStore | None, new: Sequence[NewAttachment]) -> list[Attachment]:
        out = []
        for i, n in enumerate(new):
            self.held[str(i)] = n.data
            out.append(Attachment(str(i), n.name, n.kind))
        return out

    def data(self, store: ChatStore | None, a: Attachment) -> bytes | None:
        return self.held.get(a.sha256)


class Jobs:
    """Background work that runs when the test says so, in order."""

    def __init__(self) -> None:
        self.waiting: list[tuple[Callable[[], Any], Callable[[Any, BaseException | None], None]]]
        self.waiting = []

    def run(self, fn: Callable[[], Any], on_done: Any, name: str = "") -> None:
        self.waiting.append((fn, on_done))

    def finish(self) -> None:
        while self.waiting:
            fn, done = self.waiting.pop(0)
            try:
                result = fn()
            except Exception as e:
                done(None, e)
            else:
                done(result, None)


class FakeTools:
    """A `ToolPort`: the chat's tools known at once (`cached`), or listed when the test
    calls back (`listed`); a call that runs returns token 7."""

    def __init__(self, cached: list[OfferedTool] | None) -> None:
        self.problems: list[str] = []
        self.known = cached
        self.listed: list[Callable[[list[OfferedTool]], None]] = []
        self.ran: list[str] = []

    def cached(self, settings: ChatSettings) -> list[OfferedTool] | None:
        return self.known

    def prepare(self, settings: ChatSettings, then: Callable[[list[OfferedTool]], None]) -> None:
        self.listed.append(then)

    def always_allowed(self, tool: OfferedTool) -> bool:
        return False

    def allow_always(self, tool: OfferedTool) -> None:
        pass

    def run(self, tool: OfferedTool, arguments: str) -> int:
        self.ran.append(arguments)
        return 7

    def cancel(self, token: int | None = None) -> None:
        pass


class Listener(ChatListener):
    def __init__(self, session: Callable[[], ChatSession]) -> None:
        self.session = session
        self.states: list[ReplyState | None] = []
        self.errors: list[str] = []
        self.notes: list[str] = []
        self.notices: list[str] = []

    def notice(self, text: str) -> None:
        self.notices.append(text)

    def state_changed(self) -> None:
        reply = self.session().reply
        self.states.append(reply.state if reply is not None else None)

    def error(self, message: str) -> None:
        self.errors.append(message)

    def context_note(self, text: str) -> None:
        self.notes.append(text)


@dataclass
class Rig:
    session: ChatSession
    engine: FakeEngine
    chat: PlainTranscript
    listener: Listener
    store: ChatStore | None

    def texts(self) -> list[tuple[str, str, str]]:
        return [(m.role, m.text, m.state) for m in self.chat.conversation.messages]

    def answer(self, *pieces: str, stop_reason: str = "stop") -> int:
        """The engine streams the latest request's answer and finishes it."""
        rid = len(self.engine.turns)
        self.session.started(rid, 10)
        for i, piece in enumerate(pieces, 1):
            self.session.tokens(rid, piece, i)
        self.session.finished(
            rid,
            GenerationStats(prompt_tokens=10, gen_tokens=len(pieces), stop_reason=stop_reason),  # type: ignore[arg-type]
        )
        return rid


def state(s: ChatSession) -> ReplyState | None:
    return s.reply.state if s.reply is not None else None


def make_rig(tmp_path: Path | None, loaded: bool = True) -> Rig:
    engine = FakeEngine()
    chat = PlainTranscript()
    store = ChatStore(tmp_path / "chats.sqlite3") if tmp_path is not None else None
    holder: list[ChatSession] = []
    listener = Listener(lambda: holder[0])
    session = ChatSession(engine, chat, Media(), store=store, listener=listener)
    holder.append(session)
    if loaded:
        session.engine_loaded(Loaded())
    return Rig(session, engine, chat, listener, store)


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return make_rig(tmp_path)


def test_the_session_runs_without_qt() -> None:
    """The chat's behaviour imports no Qt (the window is only one of its listeners)."""
    code = (
        "import sys, app.services.chat_session, app.services.chat_tools, "
        "app.services.chat_transcript; "
        "assert not [m for m in sys.modules if m.startswith('PySide6')], 'Qt imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_send_loads_the_model_then_streams_then_persists(tmp_path: Path) -> None:
    r = make_rig(tmp_path, loaded=False)
    s = r.session
    assert s.send("Hi")
    assert r.engine.started == [EngineChoice(MODEL, "Loading…")] and s.loading == MODEL
    assert state(s) is ReplyState.WAITING_FOR_MODEL
    assert not r.engine.turns and s.busy and not s.can_send
    s.engine_loaded(Loaded())
    assert state(s) is ReplyState.STREAMING and s.reply_row == 1
    turn = r.engine.turns[0]
    assert turn.messages == [{"role": "user", "content": "Hi"}] and turn.policy == "drop_oldest"
    r.answer("Hello", ", world.")
    assert r.texts() == [("user", "Hi", "done"), ("assistant", "Hello, world.", "done")]
    assert s.reply is None and s.can_send
    assert r.listener.states == [ReplyState.WAITING_FOR_MODEL, ReplyState.STREAMING, None]
    assert r.store is not None and s.conversation_id is not None
    stored = r.store.active_path(s.conversation_id)
    assert [(m.role, m.content, m.status) for m in stored] == [
        ("user", "Hi", "complete"),
        ("assistant", "Hello, world.", "complete"),
    ]
    assert stored[1].model == "Fake Model" and stored[1].stats["gen_tokens"] == 2


def test_regenerate_and_edit_make_branches(rig: Rig) -> None:
    s, store = rig.session, rig.store
    assert store is not None
    s.send("Name a fruit")
    rig.answer("A pear.")
    assert s.regenerate(1)
    rig.answer("A plum.")
    assert rig.texts()[1] == ("assistant", "A plum.", "done")
    assert rig.chat.message(1).branch == (2, 2)
    assert s.switch_branch(1, -1)
    assert rig.texts()[1] == ("assistant", "A pear.", "done")
    assert s.edit(0, "Name a vegetable")
    rig.answer("A carrot.")
    assert rig.texts() == [
        ("user", "Name a vegetable", "done"),
        ("assistant", "A carrot.", "done"),
    ]
    assert rig.chat.message(0).branch == (2, 2)
    # The history the model read for the edit is the new question alone.
    assert rig.engine.turns[-1].messages == [{"role": "user", "content": "Name a vegetable"}]
    assert s.delete_message(0) and rig.texts() == []


def test_stop_while_streaming_keeps_the_answer_and_continue_adds_to_it(rig: Rig) -> None:
    s = rig.session
    s.send("Count")
    s.started(1, 5)
    s.tokens(1, "one two", 2)
    s.stop()
    assert rig.engine.stops == 1 and s.busy  # it ends when the engine says so
    s.finished(1, GenerationStats(prompt_tokens=5, gen_tokens=2, stop_reason="cancelled"))
    assert rig.texts()[1] == ("assistant", "one two", "stopped") and not s.busy
    assert s.continue_reply(1)
    turn = rig.engine.turns[-1]
    assert turn.continue_text == "one two" and turn.sampling.grammar is None
    rig.answer(" three")
    assert rig.texts()[1] == ("assistant", "one two three", "done")


def test_stop_while_waiting_for_the_model_cancels_the_load(tmp_path: Path) -> None:
    r = make_rig(tmp_path, loaded=False)
    r.session.send("Hi")
    r.session.stop()
    assert r.engine.load_cancels == 1 and r.session.reply is None and not r.session.busy
    assert r.texts() == [("user", "Hi", "done")]


def test_new_chat_while_streaming_stores_the_answer_off_screen(rig: Rig) -> None:
    s, store = rig.session, rig.store
    assert store is not None
    s.send("Tell me")
    cid = s.conversation_id
    s.tokens(1, "Once", 1)
    s.new_chat()
    assert rig.texts() == [] and rig.engine.stops == 1 and not s.busy
    s.tokens(1, " upon", 2)  # late: lands in the store, not on screen
    s.finished(1, GenerationStats(gen_tokens=2, stop_reason="cancelled"))
    assert rig.texts() == []
    assert cid is not None
    assert [m.content for m in store.active_path(cid)] == ["Tell me", "Once upon"]


def test_documents_then_tools_then_the_answer_in_order(rig: Rig) -> None:
    s = rig.session
    jobs = Jobs()
    questions: list[str] = []

    class Docs:
        def search(
            self, collections: Sequence[str], query: str, k: int, *, reranker: Path | None = None
        ) -> list[Hit]:
            questions.append(query)
            return [Hit(1, Path("oil.md"), None, "Lamps", 0, 10, "Whale oil burned.", 1.0)]

    tools = FakeTools(None)  # listed each time: the servers start first
    s.use_documents(Docs(), jobs)
    s.use_tools(ToolLoop(tools, rig.chat))
    s.set_settings(ChatSettings(system_prompt="Be brief.", collections=("keeping",)))
    rig.listener.states.clear()
    assert s.send("What did the lamps burn?")
    assert rig.listener.states == [ReplyState.RETRIEVING] and not rig.engine.turns
    jobs.finish()
    assert questions == ["What did the lamps burn?"]
    assert rig.listener.states[-1] is ReplyState.WAITING_FOR_TOOLS and not rig.engine.turns
    add = OfferedTool("add", "calc", "add", "Adds", {"type": "object", "properties": {}})
    tools.listed[0]([add])
    assert rig.listener.states == [
        ReplyState.RETRIEVING,
        ReplyState.WAITING_FOR_TOOLS,
        ReplyState.STREAMING,
    ]
    turn = rig.engine.turns[0]
    system = turn.messages[0]
    assert system["role"] == "system" and system["content"].startswith("Be brief.\n\n")
    assert "Whale oil burned." in system["content"]
    assert turn.tools is not None and turn.tools[0]["function"]["name"] == "add"
    rig.answer("Oil [1].")
    assert rig.chat.message(1).grounding is not None and not s.busy


def test_a_failed_search_fails_the_answer_with_why(rig: Rig) -> None:
    s = rig.session
    jobs = Jobs()

    class Broken:
        def search(self, *args: Any, **kwargs: Any) -> list[Hit]:
            raise OSError("the index is gone")

    s.use_documents(Broken(), jobs)
    s.set_settings(ChatSettings(collections=("keeping",)))
    s.send("Anything?")
    jobs.finish()
    assert not rig.engine.turns and not s.busy
    assert rig.texts()[1] == ("assistant", "", "error")
    assert rig.listener.errors == ["Documents: the index is gone"]


def test_context_policy_stop_fails_the_answer(rig: Rig) -> None:
    """The chat's policy goes with its request; the engine's refusal fails the answer and the
    conversation stays as it was."""
    s = rig.session
    s.set_settings(ChatSettings.from_stored({"context_policy": "stop"}))
    s.send("word " * 400)
    turn = rig.engine.turns[0]
    assert turn.policy == "stop"
    with pytest.raises(ContextFullError) as refused:
        fit_messages(
            turn.messages,
            lambda ms: sum(approx_tokens(str(m["content"])) for m in ms),
            256,
            reserve=64,
            policy=turn.policy,
        )
    s.failed(1, str(refused.value))
    assert rig.texts()[1][2] == "error" and not s.busy
    assert rig.listener.errors == [str(refused.value)]
    assert s.can_send


def test_structured_output_asks_for_its_grammar_and_no_thinking(rig: Rig) -> None:
    s = rig.session
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    s.set_settings(ChatSettings(structured_output=schema))
    s.send("Where?")
    turn = rig.engine.turns[0]
    assert turn.sampling.grammar and not turn.thinking
    assert rig.chat.message(1).answer_format == "json"
    rig.answer('{"city": "Oslo"}')
    assert not s.continue_reply(1)  # a grammar cannot pick up where the text stopped


def test_tool_calls_wait_for_the_user_then_the_model_is_asked_again(rig: Rig) -> None:
    s = rig.session

    tools = FakeTools([OfferedTool("add", "calc", "add", "Adds", {})])
    loop = s.use_tools(ToolLoop(tools, rig.chat))
    s.send("What is 2 plus 3?")
    s.tool_calls(1, [{"id": "c1", "name": "add", "arguments": '{"a": 2, "b": 3}'}])
    rig.answer("")
    assert loop.active and s.busy and len(rig.engine.turns) == 1
    loop.decide(1, "c1", "allowed")
    assert tools.ran == ['{"a": 2, "b": 3}']
    loop.tool_done(7, "complete", "5", False)
    assert len(rig.engine.turns) == 2  # asked again, with the result
    assert rig.engine.turns[1].messages[-1] == {
        "role": "tool",
        "tool_call_id": "c1",
        "name": "add",
        "content": "5",
    }
    rig.answer("5.")
    assert not s.busy and rig.texts()[-1] == ("assistant", "5.", "done")


def test_a_stored_conversation_opens_with_its_settings(rig: Rig) -> None:
    s, store = rig.session, rig.store
    assert store is not None
    s.set_engine(EngineBinding("work", "gpt"))
    s.set_settings(ChatSettings(system_prompt="Be brief.", tool_rounds=3))
    s.send("Hi")
    rig.answer("Hello.")
    cid = s.conversation_id
    assert cid is not None
    stored = store.conversation(cid).settings
    assert stored == {
        "system_prompt": "Be brief.",
        "tool_rounds": 3,
        "engine": {"connection": "work", "model": "gpt"},
    }
    s.new_chat()
    assert s.settings == ChatSettings()
    s.open_conversation(cid)
    assert s.settings == ChatSettings.from_stored(stored)
    assert s.settings.engine == EngineBinding("work", "gpt")
    assert rig.texts() == [("user", "Hi", "done"), ("assistant", "Hello.", "done")]


def test_paused_refuses_and_says_why(rig: Rig) -> None:
    s = rig.session
    s.set_paused("A benchmark is running")
    assert not s.send("Hi") and rig.texts() == []
    assert rig.listener.notices[-1:] == ["A benchmark is running"]
    s.set_paused(None)
    assert s.send("Hi")


def test_a_recording_alone_is_a_message_and_nothing_at_all_is_not() -> None:
    """Push-to-talk to a model that hears sends the recording with whatever was typed,
    which may be nothing; a message with neither text nor attachment is not sent."""
    r = make_rig(None)
    s = r.session
    assert not s.send("  ") and r.texts() == []
    assert s.send("", [NewAttachment("recording-1.wav", "audio", b"RIFF")])
    question = r.chat.message(0)
    assert (question.role, question.text) == ("user", "")
    assert [(a.name, a.kind) for a in question.attachments] == [("recording-1.wav", "audio")]
    assert s.busy
