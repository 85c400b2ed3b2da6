"""A reasoning model's thinking and a chat's structured output, in the real window on the real
SmolLM2 with a real SQLite store.

Thinking: SmolLM2 is given DeepSeek-R1's chat template, whose prompt opens the thinking block,
and a grammar that forces a known reply through it ("Paris is large." "</think>" "Paris."), so
what the view and the store must hold is known exactly: the block above the answer (open while
the model thinks, folded once the answer starts, opened by a click), its own time and token
count in the stats and on screen, the thinking kept in the store apart from the answer (after a
restart too) and not sent back with the history.

Structured output: a JSON schema in the chat's settings makes the answer valid against it (the
decode loop's grammar), shown pretty-printed in a JSON code block; a schema the engine cannot
enforce is refused inline, in one line, and the setting stays as it was.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QApplication, QLabel
from pytestqt.qtbot import QtBot

from app.main import build_window
from app.services.chat_store import ChatStore
from app.ui.chat_view import CodeBlock, MarkdownBody, MessageWidget
from app.ui.main_window import MainWindow
from engine.decoding import constraints
from engine.host.runtime import Model
from engine.model.templates import ChatTemplate
from engine.settings import LoadParams, SamplingParams
from tests.app.ui.ui_signal_log import SignalLog

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")

TEMPLATES = Path(__file__).resolve().parents[2] / "data" / "chat_templates"
R1_TEMPLATE = TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"
# The reply forced through the thinking block and an answer.
THOUGHT_GBNF = 'root ::= "Paris is large." "</think>" "\\n\\nParis."'
QUESTION = "What is the capital of France?"
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}
UNSUPPORTED = {"type": "object", "not": {"required": ["city"]}}


class Windows:
    """Opens windows on the test's profile (a restart is a second window on the same
    profile); whatever is still open at the end is closed."""

    def __init__(self, qtbot: QtBot) -> None:
        self.qtbot = qtbot
        self.opened: list[MainWindow] = []

    def open(self, sampling: SamplingParams) -> MainWindow:
        w = build_window(sampling=sampling)
        w.show()
        self.qtbot.waitExposed(w)
        self.opened.append(w)
        return w

    def close(self, w: MainWindow) -> None:
        self.opened.remove(w)
        w.close()
        w.shutdown()
        w.deleteLater()
        QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


@pytest.fixture
def windows(qtbot: QtBot) -> Iterator[Windows]:
    ws = Windows(qtbot)
    yield ws
    for w in list(ws.opened):
        ws.close(w)


def thinker(qtbot: QtBot, w: MainWindow, smollm2_path: Path) -> Model:
    """Load SmolLM2 in the window and give it DeepSeek-R1's template."""
    w.controller.load(smollm2_path, LoadParams(n_ctx=1024, n_threads=2))
    qtbot.waitUntil(lambda: w.controller.loaded is not None, timeout=120_000)
    model = w.engine.worker.model
    assert model is not None
    model.template = ChatTemplate(
        R1_TEMPLATE.read_text(encoding="utf-8"),
        bos_token=model.template.bos_token,
        eos_token=model.template.eos_token,
    )
    return model


def send(qtbot: QtBot, w: MainWindow, text: str) -> None:
    qtbot.keyClicks(w.chat_view.input, text)
    qtbot.keyClick(w.chat_view.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not w.controller.busy, timeout=120_000)


def store_of(w: MainWindow) -> ChatStore:
    assert w.store is not None
    return w.store


def prose(widget: MarkdownBody) -> list[str]:
    return [x.text() for x in widget.widgets if isinstance(x, QLabel)]


def summary_figures(text: str) -> tuple[float, int]:
    m = re.fullmatch(r"Thought for (\d+\.\d) s · (\d+) tokens", text)
    assert m, text
    return float(m.group(1)), int(m.group(2))


def test_thinking_is_a_folding_block_with_its_own_figures(
    qtbot: QtBot, windows: Windows, smollm2_path: Path
) -> None:
    w = windows.open(
        SamplingParams(temperature=0.0, max_tokens=64, grammar=constraints.gbnf(THOUGHT_GBNF))
    )
    model = thinker(qtbot, w, smollm2_path)
    # What the block looked like at every change of the answer while it streamed.
    seen: list[tuple[str, bool, str, bool, bool]] = []

    def look(*_args: object) -> None:
        ws = w.chat_view.message_widgets
        if len(ws) == 2 and w.chat_model.rowCount() == 2:
            m = w.chat_model.message(1)
            seen.append(
                (
                    m.thinking,
                    m.thought is not None,
                    m.text,
                    ws[1].thinking.isVisibleTo(ws[1]),
                    ws[1].thinking.expanded,
                )
            )

    w.chat_model.dataChanged.connect(look)  # after the view's own connection: it synced
    send(qtbot, w, QUESTION)

    m = w.chat_model.message(1)
    assert (m.thinking, m.text, m.state) == ("Paris is large.", "Paris.", "done")
    stats = m.stats
    assert stats is not None
    # The block closed after "Paris is large.</think>": fewer tokens than the whole reply,
    # timed from the first token to the close, inside the reply's own time.
    assert 0 < stats.thinking_tokens < stats.gen_tokens
    assert 0 < stats.thinking_s <= stats.total_s
    assert m.thought == (stats.thinking_tokens, stats.thinking_s)
    # While it thought the block was open, and grew; it folded when the block closed, before
    # the answer's first words.
    thinking = [s for s in seen if s[0] and not s[1]]
    assert len(thinking) >= 1 and all(s[3] and s[4] for s in thinking)
    assert "Paris is large.".startswith(thinking[0][0])
    closed = [s for s in seen if s[1]]
    assert closed and not any(s[4] for s in closed) and all(s[3] for s in closed)
    assert closed[0][2] == "" and closed[-1][2] == "Paris."
    assert [s for s in seen if s[0]] == thinking + closed  # thinking, then closed: never back

    # On screen: the answer alone in the body, the block folded to its line of figures.
    reply = w.chat_view.message_widgets[1]
    block = reply.thinking
    assert block.isVisible() and not block.expanded and not block.body.isVisible()
    seconds, tokens = summary_figures(block.summary)
    assert tokens == stats.thinking_tokens and seconds == round(stats.thinking_s, 1)
    assert prose(reply.body) == ["Paris."]
    assert "tokens" in reply.footer.text()
    # A click opens it on the thinking; another folds it again.
    qtbot.mouseClick(block.toggle, Qt.MouseButton.LeftButton)
    assert block.expanded and block.body.isVisible()
    assert prose(block.body) == ["Paris is large."]
    assert block.toggle.arrowType() == Qt.ArrowType.DownArrow
    qtbot.mouseClick(block.toggle, Qt.MouseButton.LeftButton)
    assert not block.expanded and not block.body.isVisible()
    assert block.toggle.arrowType() == Qt.ArrowType.RightArrow

    # The store: the thinking apart from the answer, the figures in the stats.
    store = store_of(w)
    (conv,) = store.conversations()
    _user, answer = store.active_path(conv.id)
    assert (answer.thinking, answer.content, answer.status) == (
        "Paris is large.",
        "Paris.",
        "complete",
    )
    assert answer.stats["thinking_tokens"] == stats.thinking_tokens
    assert answer.stats["thinking_s"] == stats.thinking_s
    assert "grammar" not in answer.sampling  # the compiled grammar is not stored

    # The next turn sends the earlier answer without its thinking.
    history = w.controller._messages_for_model()
    assert history == [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "Paris."},
    ]
    log = SignalLog(w.engine.worker)  # the engine's signals as the GUI thread gets them
    send(qtbot, w, "And of Italy?")
    sent = [*history, {"role": "user", "content": "And of Italy?"}]
    text = model.render_chat(sent, enable_thinking=True)
    assert "Paris is large" not in text and text.rstrip().endswith("<think>")
    assert log.values("started") == [len(model.chat_prompt_tokens(text))]
    assert w.chat_model.message(3).thinking == "Paris is large."  # the grammar again
    windows.close(w)

    # After a restart: the same chat, its thinking folded with the same figures.
    again = windows.open(SamplingParams(temperature=0.0, max_tokens=64))
    assert again.controller.conversation_id == conv.id
    shown = again.chat_model.message(1)
    assert (shown.thinking, shown.text) == ("Paris is large.", "Paris.")
    block = again.chat_view.message_widgets[1].thinking
    assert block.isVisible() and not block.expanded
    assert summary_figures(block.summary) == (seconds, tokens)
    block.set_expanded(True)
    assert prose(block.body) == ["Paris is large."]
    # Without thinking, no block.
    assert not again.chat_view.message_widgets[0].thinking.isVisibleTo(
        again.chat_view.message_widgets[0]
    )


def code_blocks(w: MessageWidget) -> list[CodeBlock]:
    return [x for x in w.body.widgets if isinstance(x, CodeBlock)]


@pytest.mark.model
def test_structured_output_follows_the_schema_and_shows_pretty_json(
    qtbot: QtBot, windows: Windows
) -> None:
    w = windows.open(SamplingParams(temperature=0.0, max_tokens=64))
    panel = w.chat_settings
    assert panel is not None
    w.reveal(panel)
    panel.structured.setPlainText(json.dumps(CITY))
    assert not panel.structured_error.isVisible()
    assert w.controller.chat_settings["structured_output"] == CITY

    send(qtbot, w, "Name a big city and its population.")
    m = w.chat_model.message(1)
    assert m.state == "done" and m.answer_format == "json"
    answer = json.loads(m.text)
    jsonschema.validate(answer, CITY)
    # Shown pretty-printed, as a JSON code block (the highlighter's language).
    reply = w.chat_view.message_widgets[1]
    (block,) = code_blocks(reply)
    assert block.lang_label.text() == "json"
    assert block.code == json.dumps(answer, indent=2)
    assert prose(reply.body) == []
    assert not reply.thinking.isVisibleTo(reply)  # asked not to think: no block
    assert not reply.continue_button.isVisibleTo(reply)

    # Stored: the schema with the chat, and with the answer (not the compiled grammar).
    store = store_of(w)
    (conv,) = store.conversations()
    assert store.conversation(conv.id).settings["structured_output"] == CITY
    stored = store.active_path(conv.id)[1]
    assert stored.content == m.text and stored.sampling["json_schema"] == CITY
    assert "grammar" not in stored.sampling

    # A schema the engine cannot enforce: one line under the box naming the keyword; the
    # chat keeps the schema it had, in memory and in the store.
    panel.structured.setPlainText(json.dumps(UNSUPPORTED))
    assert panel.structured_error.isVisible()
    problem = panel.structured_error.text()
    assert "not" in problem and "\n" not in problem and "Traceback" not in problem
    assert problem.startswith("Not saved: the schema cannot be used")
    assert problem.endswith("(the chat keeps its previous schema)")
    assert w.controller.chat_settings["structured_output"] == CITY
    assert store.conversation(conv.id).settings["structured_output"] == CITY
    assert panel.schema == CITY
    # Not JSON at all: the same, with where it broke.
    panel.structured.setPlainText('{"type": "object",')
    assert panel.structured_error.isVisible()
    assert panel.structured_error.text().startswith("Not saved: not JSON:")
    assert w.controller.chat_settings["structured_output"] == CITY
    # A valid one again clears the message; an empty box turns structured output off.
    panel.structured.setPlainText(json.dumps(CITY, indent=4))
    assert not panel.structured_error.isVisible()
    panel.structured.setPlainText("")
    assert "structured_output" not in w.controller.chat_settings
    assert "structured_output" not in store.conversation(conv.id).settings

    # The next answer is free text (Markdown) again; the structured one stays JSON.
    send(qtbot, w, "Say hello.")
    assert w.chat_model.message(3).answer_format == "markdown"
    assert code_blocks(w.chat_view.message_widgets[1])[0].code == json.dumps(answer, indent=2)
    windows.close(w)

    # After a restart the stored answer is shown as JSON again.
    again = windows.open(SamplingParams(temperature=0.0, max_tokens=64))
    assert again.controller.conversation_id == conv.id
    (block,) = code_blocks(again.chat_view.message_widgets[1])
    assert block.code == json.dumps(answer, indent=2)


@pytest.mark.model
def test_a_schema_stored_before_the_check_fails_the_reply_in_one_line(
    qtbot: QtBot, windows: Windows
) -> None:
    """A chat imported with a schema the engine cannot enforce: the answer fails with the
    reason, nothing is generated unconstrained."""
    w = windows.open(SamplingParams(temperature=0.0, max_tokens=16))
    store = store_of(w)
    c = store.create_conversation(settings={"structured_output": UNSUPPORTED})
    store.add_message(c.id, "user", "Hi")
    store.add_message(c.id, "assistant", "Hello.")
    w.open_conversation(c.id)
    errors: list[str] = []
    w.controller.error.connect(errors.append)
    send(qtbot, w, "Name a city.")
    m = w.chat_model.message(3)
    assert m.state == "error" and m.text == ""
    assert m.error is not None and m.error.startswith("Structured output: the schema cannot")
    assert "not" in m.error and errors == [m.error]
    assert store.active_path(c.id)[-1].status == "error"


def test_an_answer_stopped_while_thinking_continues_its_thinking(
    qtbot: QtBot, windows: Windows, smollm2_path: Path
) -> None:
    """Stop while the model thinks, then Continue: the prompt ends inside the block with the
    thinking so far, and the new text goes on in the block (SmolLM2 does not close it)."""
    w = windows.open(SamplingParams(temperature=0.0, max_tokens=12))
    thinker(qtbot, w, smollm2_path)

    def stop(*_args: object) -> None:  # on the GUI thread, at the first thinking shown
        if w.chat_model.rowCount() == 2 and w.chat_model.message(1).thinking:
            w.controller.stop()

    w.chat_model.dataChanged.connect(stop)
    send(qtbot, w, QUESTION)
    m = w.chat_model.message(1)
    assert m.state == "stopped" and m.thinking and m.text == ""
    first = m.thinking
    assert m.stats is not None and m.stats.stop_reason == "cancelled"
    # Never closed: the whole reply was thinking.
    assert m.stats.thinking_tokens == m.stats.gen_tokens > 0
    before = m.stats.thinking_tokens
    reply = w.chat_view.message_widgets[1]
    assert reply.continue_button.isVisibleTo(reply)
    assert reply.thinking.summary.startswith("Thought for")

    w.chat_model.dataChanged.disconnect(stop)
    qtbot.mouseClick(reply.continue_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.controller.busy, timeout=120_000)
    m = w.chat_model.message(1)
    assert m.state == "done" and m.stats is not None
    assert m.thinking.startswith(first) and len(m.thinking) > len(first)
    assert "<think>" not in m.thinking and "</think>" not in m.thinking
    if not m.text:  # still thinking at the length limit: both parts count
        assert m.stats.thinking_tokens == before + m.stats.gen_tokens
    stored = store_of(w).active_path(w.controller.conversation_id or 0)[1]
    assert (stored.thinking, stored.content, stored.status) == (m.thinking, m.text, "complete")
