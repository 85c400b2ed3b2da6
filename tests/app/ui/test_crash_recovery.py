"""Kill the real app (SIGKILL) while it streams an answer, then check what survived: the
conversation, the partial answer (at most about a second behind), an intact database, and on
the next start the answer shown as interrupted, with Continue generating more of it."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QEvent
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.main import build_window
from app.services.chat_store import ChatStore, auto_title, default_store_path
from engine.settings import SamplingParams

pytestmark = [
    pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints"),
    pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX"),
]

ROOT = Path(__file__).resolve().parents[3]
QUESTION = "Write a long story about a dragon who learns to cook, with many chapters."


def streaming_answer(db: Path) -> tuple[int, str] | None:
    """The streamed answer as the database has it now, read through a read-only connection
    (the app is writing concurrently)."""
    if not db.exists():
        return None
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        row = con.execute(
            "SELECT id, content FROM messages WHERE role = 'assistant' AND status = 'streaming'"
        ).fetchone()
    except sqlite3.OperationalError:  # the schema is being created
        return None
    finally:
        con.close()
    return (int(row[0]), str(row[1])) if row else None


@pytest.fixture
def killed_app(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """Start the app with the autosend hook, wait until the answer has been saved twice
    (the first words, then a later flush), SIGKILL it; yields (home, text seen before)."""
    home = tmp_path / "home"
    env = dict(
        os.environ,
        QT_QPA_PLATFORM="offscreen",
        CANDLEWICK_HOME=str(home),
        CANDLEWICK_AUTOSEND=QUESTION,
    )
    db = default_store_path(home / "data")
    log = (tmp_path / "app.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and proc.poll() is None:
            got = streaming_answer(db)
            if got and got[1] and (not seen or seen[-1] != got[1]):
                seen.append(got[1])
                if len(seen) >= 2:  # saved again while streaming: well inside the answer
                    break
            time.sleep(0.05)
        if len(seen) < 2:
            log.close()
            pytest.fail(
                f"no streaming answer was saved (exit {proc.poll()}): "
                f"{(tmp_path / 'app.log').read_text(errors='replace')[-2000:]}"
            )
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    yield home, seen[-1]


@pytest.mark.model
def test_sigkill_mid_answer_loses_nothing_and_restart_offers_continue(
    killed_app: tuple[Path, str], qtbot: QtBot, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, seen = killed_app
    db = default_store_path(home / "data")
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()

    with ChatStore(db) as store:
        (conv,) = store.conversations()
        path = store.active_path(conv.id)
        assert [m.role for m in path] == ["user", "assistant"]
        assert path[0].content == QUESTION
        assert conv.title == auto_title(QUESTION)
        answer = path[1]
        assert answer.status == "streaming"
        # Everything read before the kill is there (a flush may have added more since).
        assert answer.content.startswith(seen) and len(seen) > 0
        assert answer.model and answer.sampling["max_tokens"] == 4096

    # The next start marks it interrupted and shows it with Continue.
    monkeypatch.setenv("CANDLEWICK_HOME", str(home))
    w = build_window(sampling=SamplingParams(temperature=0.0, max_tokens=8))
    try:
        w.show()
        qtbot.waitExposed(w)
        assert w.controller.conversation_id == conv.id
        assert [w.chat_model.message(r).state for r in range(2)] == ["done", "interrupted"]
        widget = w.chat_view.message_widgets[1]
        assert widget.continue_button.isVisible()
        assert w.store is not None
        assert w.store.message(answer.id).status == "interrupted"

        # Continue loads the selected model (none is loaded yet), then writes on.
        assert w.controller.loaded is None
        widget.continue_button.click()
        assert w.controller.busy
        qtbot.waitUntil(lambda: not w.controller.busy, timeout=120_000)
        reply = w.chat_model.message(1)
        assert reply.state == "done" and reply.stats is not None
        assert reply.text.startswith(answer.content) and len(reply.text) > len(answer.content)
        stored = w.store.message(answer.id)
        assert (stored.status, stored.content) == ("complete", reply.text)
        assert stored.stats["gen_tokens"] == reply.stats.gen_tokens > 0
    finally:
        w.close()
        w.shutdown()
        w.deleteLater()
        QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
