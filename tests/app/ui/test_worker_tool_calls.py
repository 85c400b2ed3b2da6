"""The engine thread offers tools to a model loaded here and says which calls it made: a
`tool_calls` signal with the parsed calls, before `finished`, on the real SmolLM2."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.ui.worker import EngineHost, EngineWorker
from engine.settings import LoadParams, SamplingParams
from tests.app.ui.ui_signal_log import SignalLog

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
CHAT = [{"role": "user", "content": "What is 2 plus 3?"}]


@pytest.fixture
def host() -> Iterator[EngineHost]:
    h = EngineHost(EngineWorker())
    yield h
    h.shutdown()


def test_tool_calls_come_before_finished(
    qtbot: QtBot, host: EngineHost, smollm2_path: Path
) -> None:
    log = SignalLog(host.worker)
    with qtbot.waitSignal(log.got_loaded, timeout=60_000):
        host.load(smollm2_path, LoadParams(n_ctx=2048, n_threads=2))
    log.clear()
    with qtbot.waitSignal(log.got_finished, timeout=120_000):
        rid = host.generate(
            CHAT,
            SamplingParams(temperature=0.0, max_tokens=200),
            tools=[ADD],
            tool_choice={"type": "function", "function": {"name": "add"}},
        )
    names = log.squeezed()
    assert names[0] == "started"
    assert names[-2:] == ["tool_calls", "finished"]
    assert log.request_ids("tool_calls") == [rid]
    [calls] = log.values("tool_calls")
    assert calls and all(set(c) == {"id", "name", "arguments"} for c in calls)
    assert {c["name"] for c in calls} == {"add"}
    for c in calls:
        assert isinstance(c["arguments"], str) and set(json.loads(c["arguments"])) == {"a", "b"}
    assert "tokens" not in names  # the call's JSON is not shown
