"""Tool calls and results as the chat shows them: a call waits with Allow once / Always
allow / Deny and then shows the decision; a result is plain text (tool output is untrusted:
never rendered), folded to one line, opened at once when the tool failed; a running tool
shows its progress and a Cancel button. The view turns each click into (row, call, decision).
"""

from __future__ import annotations

import pytest
from pytestqt.qtbot import QtBot

from app.ui.chat_model import ChatModel
from app.ui.chat_view import ChatView
from app.ui.conversation import Conversation, Message, ToolCallView, ToolProgress
from app.ui.tool_blocks import ToolCallBlock, ToolResultBlock, pretty_arguments

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")
CALL = ToolCallView("call_1", "read_note", '{"name": "groceries"}', server="notes")


def view(qtbot: QtBot, messages: list[Message]) -> tuple[ChatModel, ChatView]:
    model = ChatModel(Conversation(list(messages)))
    v = ChatView(model)
    qtbot.addWidget(v)
    v.resize(700, 600)
    v.show()
    return model, v


def test_a_call_asks_then_shows_the_decision(qtbot: QtBot) -> None:
    answer = Message("assistant", "", tool_calls=[CALL])
    model, v = view(qtbot, [Message("user", "What is on my list?"), answer])
    w = v.message_widgets[1]
    block = w.call_blocks["call_1"]
    assert block.title.text() == "Tool call: read_note · notes"
    assert block.arguments.toPlainText() == '{\n  "name": "groceries"\n}'
    assert not block.buttons.isHidden() and block.decision.isHidden()
    assert w.body.isHidden()  # an answer that is only a call shows no empty text
    with qtbot.waitSignal(v.tool_decision) as sig:
        block.always_button.click()
    assert sig.args == [1, "call_1", "always"]
    model.set_decision(1, "call_1", "always")
    assert block.buttons.isHidden() and block.decision.text() == "Always allowed"
    with qtbot.waitSignal(v.tool_decision) as sig:
        block.deny_button.click()  # hidden now, but a click still names its call
    assert sig.args == [1, "call_1", "denied"]


def test_a_result_is_plain_text_folded_and_a_failure_opens(qtbot: QtBot) -> None:
    model, v = view(qtbot, [Message("assistant", "", tool_calls=[CALL])])
    row = model.append_tool(CALL, "running")
    w = v.message_widgets[row]
    result = w.result
    assert isinstance(result, ToolResultBlock)
    assert not result.progress.isHidden() and not result.cancel_button.isHidden()
    assert result.progress.maximum() == 0  # busy until a total is known
    model.set_tool_progress(row, ToolProgress(3, 4, "reading…"))
    assert (result.progress.value(), result.progress.format()) == (750, "reading…")
    with qtbot.waitSignal(v.tool_cancel) as sig:
        result.cancel_button.click()
    assert sig.args == [row]

    hostile = "<b>bold</b> <img src=x onerror=alert(1)> [link](http://x)"
    model.set_tool_result(row, "complete", hostile, truncated=True)
    assert result.progress.isHidden() and result.cancel_button.isHidden()
    assert result.toggle.text() == "read_note: result" and not result.expanded
    assert result.text.isHidden()
    result.toggle.click()
    assert not result.text.isHidden() and result.text.toPlainText() == hostile  # as written
    assert "cut to the size limit" in result.note.text()

    row2 = model.append_tool(CALL, "running")
    model.set_tool_result(row2, "error", "server 'notes' stopped: exit code 3")
    failed = v.message_widgets[row2].result
    assert failed is not None and failed.expanded and failed.toggle.text() == "read_note: failed"
    assert failed.text.toPlainText() == "server 'notes' stopped: exit code 3"


def test_arguments_that_are_not_json_are_shown_as_written(qtbot: QtBot) -> None:
    assert pretty_arguments('{"a": [1, 2]}') == '{\n  "a": [\n    1,\n    2\n  ]\n}'
    assert pretty_arguments("{not json") == "{not json"
    block = ToolCallBlock(ToolCallView("c", "add", "{not json"))
    qtbot.addWidget(block)
    assert block.arguments.toPlainText() == "{not json" and block.title.text() == "Tool call: add"
