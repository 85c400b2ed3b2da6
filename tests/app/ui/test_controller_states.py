"""The chat controller's reply lifecycle, step by step, on the real engine thread with a
scripted fake model (tests/fakes.py): no llama.cpp, no GGUF file, milliseconds a test.

Each test drives one path through the states of `ActiveReply`: waiting for the model, for the
chat's tools, streaming, and its end (finished, stopped, failed, abandoned), and checks what
the chat shows, what the controller says (busy, whether Send is on) and that the late signals
of an abandoned reply land nowhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from PySide6.QtCore import QTimer
from pytestqt.qtbot import QtBot

from app.services.chat_store import ChatStore
from app.services.mcp_client import McpHub
from app.services.mcp_config import McpConfigStore
from app.ui.active_reply import ReplyState
from app.ui.chat_model import ChatModel
from app.ui.controller import ChatController
from app.ui.conversation import Conversation, Message
from app.ui.tool_runner import OfferedTool, ToolRunner
from app.ui.worker import EngineHost, EngineWorker
from engine.host.stats import GenerationStats
from engine.settings import LoadParams
from tests.app.ui.ui_signal_log import SignalLog
from tests.fakes import FakeModels, FakeReply

MODEL = Path("fake-model.gguf")  # never read: the fake loads any path
WAIT_MS = 5_000


def record(signal: Any) -> list[Any]:
    got: list[Any] = []
    signal.connect(lambda *args: got.append(args[0] if len(args) == 1 else args))
    return got


@dataclass
class Rig:
    qtbot: QtBot
    models: FakeModels
    host: EngineHost
    chat: ChatModel
    controller: ChatController

    def __post_init__(self) -> None:
        c = self.controller
        self.busy = record(c.busy_changed)
        self.send_state = record(c.send_state_changed)
        self.errors = record(c.error)
        self.notices = record(c.notice)
        self.loading = record(c.loading_started)
        # The engine's signals as the GUI thread gets them (a blocker on the worker's own
        # would run in the engine thread).
        self.log = SignalLog(self.host.worker)

    def state(self) -> ReplyState | None:
        reply = self.controller.reply
        return reply.state if reply is not None else None

    def idle(self) -> None:
        self.qtbot.waitUntil(lambda: not self.controller.busy, timeout=WAIT_MS)

    def until(self, cond: Callable[[], bool]) -> None:
        self.qtbot.waitUntil(cond, timeout=WAIT_MS)

    def texts(self) -> list[tuple[str, str, str]]:
        return [(m.role, m.text, m.state) for m in self.chat.conversation.messages]

    def load(self) -> None:
        with self.qtbot.waitSignal(self.log.got_loaded, timeout=WAIT_MS):
            assert self.controller.load(MODEL, LoadParams(n_ctx=2048))
        self.clear()

    def clear(self) -> None:
        for got in (self.busy, self.send_state, self.errors, self.notices, self.loading):
            got.clear()


@pytest.fixture
def rig(qtbot: QtBot) -> Iterator[Rig]:
    models = FakeModels(name="Fake Model")
    host = EngineHost(EngineWorker(models, token_interval_s=0))
    chat = ChatModel()
    controller = ChatController(host, chat, library=lambda: (MODEL, LoadParams(n_ctx=2048)))
    yield Rig(qtbot, models, host, chat, controller)
    models.release_loads()
    host.shutdown()


def test_send_with_no_model_loads_it_then_streams_then_finishes(rig: Rig) -> None:
    c = rig.controller
    rig.models.reply = FakeReply(["Hello", ",", " world", "."], hold_after=2)
    assert c.can_send and c.loaded is None
    assert c.send("Hi")
    assert rig.state() is ReplyState.WAITING_FOR_MODEL and c.busy and not c.can_send
    assert c.reply_row is None and rig.loading == [MODEL]
    rig.until(lambda: rig.chat.rowCount() == 2 and rig.chat.message(1).text == "Hello,")
    assert rig.state() is ReplyState.STREAMING and c.reply_row == 1
    assert c.loaded is not None and c.loaded.name == "Fake Model"
    rig.models.reply.release()
    rig.idle()
    assert rig.texts() == [("user", "Hi", "done"), ("assistant", "Hello, world.", "done")]
    assert c.reply is None and c.can_send and rig.models.loads == [MODEL]
    assert rig.busy == [True, True, False]  # loading, answering, done
    assert rig.send_state == [(True, None), (False, None)]
    stats = rig.chat.message(1).stats
    assert stats is not None and stats.gen_tokens == 4 and stats.stop_reason == "stop"
    assert rig.chat.message(1).model == "Fake Model" and not rig.errors


def test_send_while_loaded_streams_at_once(rig: Rig) -> None:
    rig.load()
    rig.models.reply = FakeReply(["Sure", "."], prompt_tokens=7)
    context = record(rig.controller.context_changed)
    assert rig.controller.send("Again?")
    assert rig.state() is ReplyState.STREAMING and rig.controller.reply_row == 1
    rig.idle()
    assert rig.texts()[-1] == ("assistant", "Sure.", "done")
    assert rig.busy == [True, False] and rig.loading == [] and rig.models.loads == [MODEL]
    assert (7, 2048) in context  # the prompt's size as the engine counted it
    assert context[-1] == (9, 2048)  # prompt and answer


def test_sending_is_refused_while_busy_and_without_text(rig: Rig) -> None:
    rig.load()
    rig.models.reply = FakeReply(hold_after=1)
    assert not rig.controller.send("   ")
    assert rig.controller.send("One")
    assert not rig.controller.send("Two")
    assert rig.chat.rowCount() == 2
    rig.models.reply.release()
    rig.idle()


def test_send_with_nothing_chosen_asks_for_a_model(qtbot: QtBot) -> None:
    host = EngineHost(EngineWorker(FakeModels(), token_interval_s=0))
    try:
        c = ChatController(host, ChatModel(), library=lambda: None)
        errors = record(c.error)
        assert not c.send("Hi") and not c.busy
        assert errors == ["Select a model in the library first"]
        assert c.chat.rowCount() == 0
    finally:
        host.shutdown()


def test_stop_while_waiting_for_the_model(rig: Rig) -> None:
    rig.models.hold_loads()
    c = rig.controller
    assert c.send("Hi")
    assert rig.state() is ReplyState.WAITING_FOR_MODEL
    with rig.qtbot.waitSignal(rig.log.got_load_cancelled, timeout=WAIT_MS):
        c.stop()  # the load is cancelled too
        assert c.reply is None and not c.busy and c.can_send
    assert rig.texts() == [("user", "Hi", "done")] and c.loaded is None
    assert rig.busy == [True, False] and not rig.errors


def test_load_cancelled_while_waiting_for_the_model(rig: Rig) -> None:
    rig.models.hold_loads()
    c = rig.controller
    assert c.send("Hi")
    with rig.qtbot.waitSignal(rig.log.got_load_cancelled, timeout=WAIT_MS):
        c.cancel_load()  # the library's Cancel
    assert c.reply is None and not c.busy and c.loading is None
    assert "Loading cancelled" in rig.notices and rig.busy == [True, False]
    assert rig.texts() == [("user", "Hi", "done")]


def test_a_load_that_fails_ends_the_waiting_reply(rig: Rig) -> None:
    rig.models.load_error = "not enough memory, says the fake"
    c = rig.controller
    assert c.send("Hi")
    rig.idle()
    assert rig.errors == [f"Could not load {MODEL.name}: not enough memory, says the fake"]
    assert c.reply is None and c.loaded is None and c.loading is None and c.can_send
    assert rig.texts() == [("user", "Hi", "done")]


def test_a_failure_while_streaming_keeps_the_text_as_interrupted(rig: Rig) -> None:
    rig.load()
    rig.models.reply = FakeReply(["Half", " an"], fail_after=2, error="the decode broke")
    assert rig.controller.send("Hi")
    rig.idle()
    m = rig.chat.message(1)
    assert (m.text, m.state, m.error) == ("Half an", "interrupted", "the decode broke")
    assert rig.errors == ["the decode broke"] and rig.busy == [True, False]


def test_a_failure_before_any_text_marks_the_answer_failed(rig: Rig) -> None:
    rig.load()
    rig.models.reply = FakeReply(["never"], fail_after=0, error="no slot for you")
    assert rig.controller.send("Hi")
    rig.idle()
    m = rig.chat.message(1)
    assert (m.text, m.state, m.error) == ("", "error", "no slot for you")


def test_stop_while_streaming(rig: Rig) -> None:
    rig.load()
    rig.models.reply = FakeReply(["First", " second"], hold_after=1)
    c = rig.controller
    assert c.send("Hi")
    rig.until(lambda: bool(rig.log.request_ids("tokens")))
    assert rig.state() is ReplyState.STREAMING and rig.send_state == [(True, None)]
    c.stop()
    assert c.busy  # until the engine says the reply ended
    rig.idle()
    m = rig.chat.message(1)
    assert m.text == "First" and m.state == "stopped"
    assert m.stats is not None and m.stats.stop_reason == "cancelled"
    assert rig.send_state == [(True, None), (False, None)]


def test_new_chat_while_streaming_drops_the_late_signals(rig: Rig) -> None:
    rig.load()
    rig.models.reply = FakeReply(["Old", " answer"], hold_after=1)
    c = rig.controller
    w, log = rig.host.worker, rig.log
    assert c.send("First question")
    rig.until(lambda: bool(log.request_ids("tokens")))
    old = log.request_ids("tokens")[0]
    c.new_chat()
    assert c.reply is None and not c.busy and rig.chat.rowCount() == 0
    # The abandoned reply ends (stopped) in the engine; nothing shows it.
    rig.until(lambda: log.request_ids("finished") == [old])
    assert rig.chat.rowCount() == 0

    rig.models.reply = FakeReply(["New", " one"], hold_after=1)
    log.clear()
    assert c.send("Second question")
    rig.until(lambda: bool(log.request_ids("tokens")))
    row = c.reply_row
    assert row == 1 and log.request_ids("tokens")[0] != old
    # Late signals of the old request: none lands in the answer streaming now.
    w.started.emit(old, 99_999)
    w.tokens.emit(old, "STALE", 99_999)
    w.reasoning.emit(old, "STALE THOUGHT", 99_999)
    w.tool_calls.emit(old, [{"id": "x", "name": "y", "arguments": "{}"}])
    w.finished.emit(old, GenerationStats(gen_tokens=99_999))
    w.failed.emit(old, "a stale failure")
    rig.qtbot.wait(20)
    m = rig.chat.message(row)
    assert m.text == "New" and m.thinking == "" and m.state == "streaming" and m.stats is None
    assert c.busy and c.reply_row == row and not rig.errors
    rig.models.reply.release()
    rig.idle()
    assert rig.texts() == [("user", "Second question", "done"), ("assistant", "New one", "done")]


def test_new_chat_while_streaming_stores_the_answer_as_stop_does(rig: Rig, tmp_path: Path) -> None:
    """The abandoned answer is stored as a stopped one, with the figures of its cancelled
    reply; it was stored 'complete' with no figures, and reopened as a finished answer."""
    c = rig.controller
    c.store = store = ChatStore(tmp_path / "chats.sqlite3")
    try:
        rig.load()
        rig.models.reply = FakeReply(["Old", " answer"], hold_after=1)
        assert c.send("First question")
        rig.until(lambda: bool(rig.log.request_ids("tokens")))
        cid = c.conversation_id
        assert cid is not None
        c.new_chat()
        assert not c.busy and rig.chat.rowCount() == 0
        rig.until(lambda: bool(store.active_path(cid)[-1].stats))
        stored = store.active_path(cid)[-1]
        assert (stored.role, stored.content, stored.status) == ("assistant", "Old", "complete")
        assert stored.stats["stop_reason"] == "cancelled" and stored.stats["gen_tokens"] == 1
        c.open_conversation(cid)  # shown as after Stop
        m = rig.chat.message(1)
        assert (m.text, m.state) == ("Old", "stopped")
        assert m.stats is not None and m.stats.stop_reason == "cancelled"
    finally:
        c.detach_store()
        store.close()


def test_quit_while_streaming_stores_the_answer_as_interrupted(rig: Rig, tmp_path: Path) -> None:
    """An answer cut by quitting is kept with what was written, marked interrupted (Continue
    offers to finish it); it was stored 'complete' with no figures."""
    c = rig.controller
    c.store = store = ChatStore(tmp_path / "chats.sqlite3")
    try:
        rig.load()
        rig.models.reply = FakeReply(["Old", " answer"], hold_after=1)
        assert c.send("First question")
        rig.until(lambda: bool(rig.log.request_ids("tokens")))
        rig.until(lambda: rig.chat.rowCount() == 2 and rig.chat.message(1).text == "Old")
        cid = c.conversation_id
        assert cid is not None
        c.detach_store()  # what the window does at quit, the engine thread ended
        stored = store.active_path(cid)[-1]
        assert (stored.role, stored.content, stored.status) == ("assistant", "Old", "interrupted")
        assert stored.stats["error"] == "The app closed before the answer ended"
    finally:
        c.detach_store()
        store.close()


def test_a_full_disk_while_an_answer_streams_is_one_line_and_keeps_what_was_saved(
    rig: Rig, tmp_path: Path
) -> None:
    """The store refuses the answer's last write (SQLite's SQLITE_FULL: the database may not
    grow): the chat says so once, in one line, the answer finishes on screen, and the store
    keeps it as last saved. The store's error escaped the engine's signal before."""
    c = rig.controller
    c.store = store = ChatStore(tmp_path / "chats.sqlite3")
    try:
        rig.load()
        script = FakeReply(["Old", " answer " * 20_000], hold_after=1)
        rig.models.reply = script
        assert c.send("First question")
        rig.until(lambda: rig.chat.rowCount() == 2 and rig.chat.message(1).text == "Old")
        cid = c.conversation_id
        assert cid is not None
        rig.until(lambda: store.active_path(cid)[-1].content == "Old")  # its first flush
        pages = store._db.execute("PRAGMA page_count").fetchone()[0]
        store._db.execute(f"PRAGMA max_page_count = {pages}")
        script.release()
        rig.until(lambda: not c.busy)
        assert (
            rig.chat.message(1).text.startswith("Old answer")
            and rig.chat.message(1).state == "done"
        )
        assert len(rig.errors) == 1 and "\n" not in rig.errors[0], rig.errors
        assert rig.errors[0].startswith("The answer is no longer being saved: the disk is full")
        stored = store.active_path(cid)[-1]
        assert (stored.content, stored.status) == ("Old", "streaming")  # reopens interrupted
    finally:
        c.detach_store()
        store.close()


def _chat_with_answer(rig: Rig, state: str = "done") -> None:
    rig.chat.set_conversation(
        Conversation(
            messages=[Message("user", "Name a fruit."), Message("assistant", "An apple", state)]
        )
    )  # type: ignore[arg-type]


def test_regenerate_with_the_model_loaded(rig: Rig) -> None:
    rig.load()
    _chat_with_answer(rig)
    rig.models.reply = FakeReply(["A pear."])
    assert rig.controller.regenerate(1)
    assert rig.state() is ReplyState.STREAMING
    rig.idle()
    assert rig.texts() == [("user", "Name a fruit.", "done"), ("assistant", "A pear.", "done")]
    assert rig.busy == [True, False]


def test_regenerate_loads_the_model_first(rig: Rig) -> None:
    _chat_with_answer(rig)
    rig.models.reply = FakeReply(["A plum."])
    assert rig.controller.regenerate(1)
    assert rig.state() is ReplyState.WAITING_FOR_MODEL and rig.chat.rowCount() == 1
    rig.idle()
    assert rig.texts()[-1] == ("assistant", "A plum.", "done")
    assert rig.busy == [True, True, False] and rig.models.loads == [MODEL]


def test_edit_answers_the_new_question(rig: Rig) -> None:
    rig.load()
    _chat_with_answer(rig)
    rig.models.reply = FakeReply(["A carrot."])
    assert not rig.controller.edit(1, "not a question")  # an answer is not edited
    assert rig.controller.edit(0, "Name a vegetable.")
    rig.idle()
    assert rig.texts() == [
        ("user", "Name a vegetable.", "done"),
        ("assistant", "A carrot.", "done"),
    ]
    assert rig.busy == [True, False]


def test_continue_with_the_model_loaded(rig: Rig) -> None:
    rig.load()
    _chat_with_answer(rig, "stopped")
    rig.models.reply = FakeReply([" and", " a pear."])
    c = rig.controller
    assert not c.continue_reply(0)  # a question is not continued
    assert c.continue_reply(1)
    assert rig.state() is ReplyState.STREAMING and c.reply_row == 1
    assert rig.chat.message(1).state == "streaming"
    rig.idle()
    assert rig.texts()[-1] == ("assistant", "An apple and a pear.", "done")
    assert rig.chat.rowCount() == 2 and rig.busy == [True, False]


def test_continue_loads_the_model_first(rig: Rig) -> None:
    _chat_with_answer(rig, "interrupted")
    rig.models.reply = FakeReply([" a day."])
    c = rig.controller
    assert c.continue_reply(1)
    assert rig.state() is ReplyState.WAITING_FOR_MODEL
    assert rig.chat.message(1).state == "interrupted"  # untouched until it streams
    rig.idle()
    assert rig.texts()[-1] == ("assistant", "An apple a day.", "done")
    assert rig.busy == [True, True, False]


def test_stop_while_a_continue_waits_for_the_model_leaves_the_answer(rig: Rig) -> None:
    rig.models.hold_loads()
    _chat_with_answer(rig, "stopped")
    c = rig.controller
    assert c.continue_reply(1)
    c.stop()
    assert c.reply is None and not c.busy
    assert rig.texts()[-1] == ("assistant", "An apple", "stopped")


def test_pause_turns_send_off_and_refuses_with_its_reason(rig: Rig) -> None:
    rig.load()
    _chat_with_answer(rig, "stopped")
    c = rig.controller
    c.set_paused("A benchmark is running")
    assert not c.can_send and not c.busy
    assert rig.send_state == [(False, "A benchmark is running")]
    assert not c.send("Hi")
    assert not c.regenerate(1) and not c.continue_reply(1) and not c.edit(0, "Hm?")
    assert rig.notices == ["A benchmark is running"] * 4
    assert rig.chat.rowCount() == 2 and not c.busy and rig.busy == []
    c.set_paused(None)
    assert c.can_send and rig.send_state[-1] == (False, None)
    assert c.send("Hi")
    assert rig.send_state[-1] == (True, None)
    rig.idle()
    assert rig.send_state[-1] == (False, None)


def test_a_pause_while_busy_keeps_send_off_after_the_reply(rig: Rig) -> None:
    rig.load()
    rig.models.reply = FakeReply(hold_after=1)
    c = rig.controller
    assert c.send("Hi")
    c.set_paused("paused")
    rig.models.reply.release()
    rig.idle()
    assert rig.send_state == [(True, None), (True, "paused"), (False, "paused")]
    assert not c.can_send


# -- the chat's tools ----------------------------------------------------------------------

ADD = OfferedTool(
    "add",
    "calc",
    "add",
    "Adds two numbers",
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
)


class FakeToolRunner(ToolRunner):
    """The chat's tools without MCP servers: listed when the test says, run at once."""

    def __init__(self, tools: list[OfferedTool]) -> None:
        super().__init__(cast(McpConfigStore, None), hub=cast(McpHub, object()))
        self.tools = tools
        self.listed = False
        self.waiting: list[Callable[[list[OfferedTool]], None]] = []
        self.ran: list[tuple[str, str]] = []
        self._token = 0

    def cached(self, settings: dict[str, Any]) -> list[OfferedTool] | None:
        return self.tools if self.listed else None

    def prepare(self, settings: dict[str, Any], then: Callable[[list[OfferedTool]], None]) -> None:
        self.waiting.append(then)

    def finish_listing(self) -> None:
        self.listed = True
        waiting, self.waiting = self.waiting, []
        for then in waiting:
            then(self.tools)

    def always_allowed(self, tool: OfferedTool) -> bool:
        return False

    def run(self, tool: OfferedTool, arguments: str) -> int:
        self._token += 1
        token = self._token
        self.ran.append((tool.name, arguments))
        QTimer.singleShot(0, lambda: self.done.emit(token, "complete", "5", False))
        return token

    def cancel(self, token: int | None = None) -> None:
        pass

    def shutdown(self) -> None:
        pass


def test_a_reply_waits_for_the_tools_then_streams(rig: Rig) -> None:
    rig.load()
    runner = FakeToolRunner([ADD])
    rig.controller.use_tools(runner)
    rig.models.reply = FakeReply(['{"response": "Hi', ' there"}'])
    assert rig.controller.send("Hi")
    assert rig.state() is ReplyState.WAITING_FOR_TOOLS and rig.chat.rowCount() == 1
    assert "Starting the chat's tool servers…" in rig.notices
    runner.finish_listing()
    assert rig.state() is ReplyState.STREAMING
    rig.idle()
    assert rig.texts()[-1] == ("assistant", "Hi there", "done")
    assert rig.busy == [True, True, False]  # tools, answering, done


def test_stop_while_waiting_for_the_tools_drops_their_late_list(rig: Rig) -> None:
    rig.load()
    runner = FakeToolRunner([ADD])
    rig.controller.use_tools(runner)
    assert rig.controller.send("Hi")
    rig.controller.stop()
    assert rig.controller.reply is None and not rig.controller.busy
    runner.finish_listing()  # too late: nobody waits for them
    assert rig.controller.reply is None and rig.chat.rowCount() == 1


def test_a_tool_call_waits_for_the_user_then_the_model_answers(rig: Rig) -> None:
    rig.load()
    runner = FakeToolRunner([ADD])
    runner.listed = True
    turns = rig.controller.use_tools(runner)
    rig.models.next_replies.append(
        FakeReply(['{"tool_calls": [{"name": "add", ', '"arguments": {"a": 2, "b": 3}}]}'])
    )
    rig.models.reply = FakeReply(['{"response": "It is 5."}'])
    c = rig.controller
    assert c.send("What is 2 + 3?")
    rig.until(lambda: turns.active)  # the call waits for Allow/Deny
    assert c.reply is None and c.busy and not c.can_send
    call = rig.chat.message(1).tool_calls[0]
    assert (call.name, call.decision) == ("add", "pending")
    turns.decide(1, call.id, "allowed")
    rig.idle()
    assert runner.ran == [("add", '{"a": 2, "b": 3}')]
    assert [(r, s) for r, _, s in rig.texts()] == [
        ("user", "done"),
        ("assistant", "done"),
        ("tool", "done"),
        ("assistant", "done"),
    ]
    assert rig.chat.message(2).text == "5" and rig.texts()[-1][1] == "It is 5."
    assert rig.busy[-1] is False and rig.send_state[-1] == (False, None)
