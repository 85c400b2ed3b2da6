"""Refresh the screenshots in docs/screenshots/ from the real app on the bundled model.

    QT_QPA_PLATFORM=offscreen .venv/bin/python scripts/screenshots.py
    # or on an X server (what users see): QT_QPA_PLATFORM=xcb DISPLAY=:1 ...

Takes pictures of the main window: the Models page with the memory estimate before loading,
a reply while it is streaming, the performance panel after it, and the conversations
sidebar with a pinned chat; then the window after the reply in the light and the dark
colour scheme (View → Appearance), at 1600x1000, 1280x800 and 1000x700
(`window-<scheme>-<width>x<height>.png`), and each page of the rail at 1000x700
(`page-<name>-1000x700.png`). Uses a private, empty profile so nothing from your own
settings shows up.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from PySide6.QtCore import QEventLoop, QObject, QTimer, Slot  # noqa: E402
from PySide6.QtWidgets import QApplication, QWidget  # noqa: E402

from engine.settings import SamplingParams  # noqa: E402

QUESTION = "Write a Python function that reverses a string, and explain it briefly."
SIZES = ((1600, 1000), (1280, 800), (1000, 700))


class TokenCounter(QObject):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0
        self.done = False

    @Slot(int, str, int)
    def on_tokens(self, _rid: int, _text: str, n: int) -> None:
        self.n = n

    @Slot(int, object)
    def on_finished(self, _rid: int, _stats: object) -> None:
        self.done = True


def spin_until(cond: Callable[[], bool], timeout_s: float = 300) -> None:
    """Run the real event loop (idle between events) until `cond` holds."""
    loop = QEventLoop()
    check = QTimer()
    end = time.monotonic() + timeout_s
    check.timeout.connect(lambda: loop.quit() if cond() or time.monotonic() > end else None)
    check.start(20)
    if not cond():
        loop.exec()
    check.stop()


def save(widget: QWidget, path: Path) -> None:
    QApplication.processEvents()
    path.parent.mkdir(parents=True, exist_ok=True)
    if not widget.grab().save(str(path)):
        raise SystemExit(f"could not write {path}")
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    ap.add_argument(
        "--stream-tokens",
        type=int,
        default=60,
        help="take the mid-stream picture after this many tokens",
    )
    args = ap.parse_args()
    os.environ["CANDLEWICK_HOME"] = tempfile.mkdtemp(prefix="candlewick-shots-")
    qapp = QApplication.instance() or QApplication([])  # noqa: F841 (kept alive)
    from app.main import build_window

    window = build_window(
        sampling=SamplingParams(temperature=0.0, max_tokens=400), model_manager=True
    )
    window.resize(*SIZES[0])
    window.show()
    window.focus_input()
    counter = TokenCounter()
    window.engine.worker.tokens.connect(counter.on_tokens)
    window.engine.worker.finished.connect(counter.on_finished)
    try:
        window.show_page("models")
        save(window, args.out / "library-estimate.png")
        window.show_page("chat")
        window.chat_view.input.setPlainText(QUESTION)
        window.chat_view.input.submitted.emit(QUESTION)
        spin_until(lambda: counter.n >= args.stream_tokens or counter.done)
        save(window, args.out / "chat-streaming.png")
        spin_until(lambda: counter.done)
        t_end = time.monotonic() + 1.5  # a few panel ticks after the reply
        spin_until(lambda: time.monotonic() > t_end)
        save(window, args.out / "performance.png")
        save(window.perf_panel, args.out / "performance-panel.png")
        if window.store is not None and window.conversation_list is not None:
            # A few earlier chats so the list looks like a used one.
            for title, q, a in (
                ("Trip to Lisbon", "Plan three days in Lisbon.", "Day 1: …"),
                ("Bread", "Why does dough need to rest?", "Gluten relaxes…"),
            ):
                c = window.store.create_conversation(title)
                window.store.add_message(c.id, "user", q)
                window.store.add_message(c.id, "assistant", a)
            if window.controller.conversation_id is not None:
                window.conversation_list.set_pinned(window.controller.conversation_id, True)
            window.conversation_list.refresh()
            window.reveal(window.conversation_list)
            save(window, args.out / "conversations.png")
        for name in ("light", "dark"):
            window.set_scheme(name)
            for width, height in SIZES:
                window.resize(width, height)
                t_end = time.monotonic() + 1.0  # the layout settles, the panel ticks
                spin_until(lambda t=t_end: time.monotonic() > t)  # type: ignore[misc]
                save(window, args.out / f"window-{name}-{width}x{height}.png")
        window.set_scheme("light")
        window.resize(*SIZES[-1])
        for key in window.page_keys():
            window.show_page(key)
            t_end = time.monotonic() + 0.5
            spin_until(lambda t=t_end: time.monotonic() > t)  # type: ignore[misc]
            save(window, args.out / f"page-{key}-1000x700.png")
        window.show_page("chat")
        window.set_scheme("system")
    finally:
        window.close()
        window.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
