"""Images in the chat window, on the real SmolLM2 with the test vision projector paired beside
it: a picture attached by drag and drop and another by paste go to the model with the
question (its answer means nothing: the projector's weights are noise), the sent message
shows their thumbnails, and so does the chat after the window is closed and opened again. A
model without a projector refuses an attachment before sending, in one line; a file that does
not decode is refused the same way, and what was typed stays."""

from __future__ import annotations

import wave
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import (
    QDragEnterEvent,
    QDragMoveEvent,
    QDropEvent,
    QGuiApplication,
    QImage,
)
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.services.library import LibraryEntry
from app.ui.main_window import MainWindow
from engine.settings import SamplingParams
from tests.app.ui.model_window import (
    close_window,
    library,
    linked_folder,
    model_window,
    open_window,
)
from tests.media_files import png
from tests.projector_gguf import test_image, test_tone

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
# On the X-server tier (tests/app/ui/visual/test_xserver_tier.py runs it on Xvfb): drag and
# drop and the clipboard as a person's window has them.
pytestmark = [
    pytest.mark.xserver,
    pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints"),
]


@pytest.fixture
def paired(tmp_path: Path, smollm2_path: Path, vision_projector_path: Path) -> Path:
    """A folder holding SmolLM2 (a link) and the test projector, as a Hub repo has them."""
    return linked_folder(tmp_path / "SmolVLM-test", smollm2_path, vision_projector_path)


def drop_files(w: MainWindow, paths: list[Path]) -> None:
    """Drag files onto the input and drop them there, as a file manager does."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    target = w.chat_view.input.viewport()
    at, copy = QPoint(10, 10), Qt.DropAction.CopyAction
    left, none = Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
    enter = QDragEnterEvent(at, copy, mime, left, none)
    QApplication.sendEvent(target, enter)
    assert enter.isAccepted()
    QApplication.sendEvent(target, QDragMoveEvent(at, copy, mime, left, none))
    drop = QDropEvent(QPointF(at), copy, mime, left, none)
    QApplication.sendEvent(target, drop)
    assert drop.isAccepted()


def type_and_send(qtbot: QtBot, w: MainWindow, text: str) -> None:
    qtbot.keyClicks(w.chat_view.input, text)
    qtbot.keyClick(w.chat_view.input, Qt.Key.Key_Return)


@pytest.fixture
def window(qtbot: QtBot, paired: Path) -> Iterator[tuple[MainWindow, LibraryEntry]]:
    with model_window(qtbot, paired, GREEDY) as opened:
        yield opened


def test_the_library_and_the_engine_picker_show_the_pair(
    window: tuple[MainWindow, LibraryEntry],
) -> None:
    w, entry = window
    assert entry.capabilities == ("vision",)
    assert w.library_panel.load_params().mmproj == entry.mmproj
    name = w.library_model.index(w.library_model.row_of(entry.id), 0).data()
    assert name.endswith("(vision)")
    if w.engine_picker is not None:
        assert w.engine_picker.combo.itemText(0).endswith("(vision)")


def test_drop_and_paste_send_pictures_and_the_thumbnails_come_back(
    qtbot: QtBot, window: tuple[MainWindow, LibraryEntry], tmp_path: Path
) -> None:
    w, entry = window
    picture = tmp_path / "noise.png"
    picture.write_bytes(png(test_image()))
    drop_files(w, [picture])
    tray = w.chat_view.attacher.tray
    qtbot.waitUntil(lambda: len(tray.items()) == 1)
    assert tray.thumbs[0].has_picture and tray.isVisible()
    type_and_send(qtbot, w, "What is in this picture?")
    c = w.controller
    qtbot.waitUntil(lambda: c.chat.rowCount() == 2 and not c.busy, timeout=180_000)
    assert c.loaded is not None and c.loaded.media == frozenset({"image"})
    answer = c.chat.message(1)
    assert answer.state == "done" and answer.stats is not None, answer.error
    # Two image chunks of 16 rows (tile and overview) went in with the question.
    assert answer.stats.prompt_tokens > 32
    assert tray.items() == [] and not tray.isVisible()
    sent = w.chat_view.message_widgets[0].attachments
    assert [t.name for t in sent.thumbs] == ["noise.png"] and sent.thumbs[0].has_picture

    # A picture on the clipboard, pasted into the input: an attachment, not text.
    QGuiApplication.clipboard().setImage(QImage.fromData(png(test_image(seed=7))))
    w.chat_view.input.paste()
    qtbot.waitUntil(lambda: len(tray.items()) == 1)
    assert tray.items()[0].name == "pasted-1.png"
    assert w.chat_view.input.toPlainText() == ""
    type_and_send(qtbot, w, "And this one?")
    qtbot.waitUntil(lambda: c.chat.rowCount() == 4 and not c.busy, timeout=180_000)
    second = c.chat.message(3)
    assert second.state == "done" and second.stats is not None, second.error
    # The history's first picture is sent again with the new one: four image chunks.
    assert second.stats.prompt_tokens > answer.stats.prompt_tokens + 32
    cid = c.conversation_id
    assert cid is not None
    close_window(w)

    again = open_window(qtbot, library(), entry, GREEDY)
    try:
        again.open_conversation(cid)
        shown = again.chat_view.message_widgets
        assert [m.role for m in again.chat_model.conversation.messages] == ["user", "assistant"] * 2
        for row, name in ((0, "noise.png"), (2, "pasted-1.png")):
            thumbs = shown[row].attachments.thumbs
            assert [t.name for t in thumbs] == [name]
            assert thumbs[0].has_picture
    finally:
        close_window(again)


def test_a_model_without_a_projector_refuses_before_sending(
    qtbot: QtBot, tmp_path: Path, smollm2_path: Path
) -> None:
    folder = linked_folder(tmp_path / "text-only", smollm2_path, model_name="SmolLM2.gguf")
    with model_window(qtbot, folder, GREEDY) as (w, _):
        picture = tmp_path / "noise.png"
        picture.write_bytes(png(test_image()))
        qtbot.keyClicks(w.chat_view.input, "kept as typed")
        drop_files(w, [picture])
        banner = w.banner
        qtbot.waitUntil(lambda: banner.isVisible())
        assert banner.label.text() == (
            "This model reads text only: load it with its projector (mmproj) to send images"
        )
        assert w.chat_view.attacher.items() == []
        assert w.chat_view.input.toPlainText() == "kept as typed"
        assert not w.controller.busy and w.controller.chat.rowCount() == 0


def test_a_file_that_does_not_decode_is_refused_and_nothing_typed_is_lost(
    qtbot: QtBot, window: tuple[MainWindow, LibraryEntry], tmp_path: Path
) -> None:
    w, _ = window
    broken = tmp_path / "broken.png"
    broken.write_bytes(png(test_image())[:200])  # cut short
    qtbot.keyClicks(w.chat_view.input, "still here")
    drop_files(w, [broken])
    qtbot.waitUntil(lambda: w.banner.isVisible())
    assert w.banner.label.text().startswith("broken.png is truncated or corrupt")
    assert "\n" not in w.banner.label.text()
    assert w.chat_view.attacher.items() == []
    assert w.chat_view.input.toPlainText() == "still here"


def test_audio_for_a_vision_projector_is_refused_through_the_attach_button(
    qtbot: QtBot, window: tuple[MainWindow, LibraryEntry], tmp_path: Path
) -> None:
    w, _ = window
    clip = tmp_path / "tone.wav"
    with wave.open(str(clip), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(16000)
        f.writeframes((test_tone(0.5) * 32767).astype("<i2").tobytes())
    w.chat_view.attacher.chooser = lambda _parent: [clip]
    qtbot.mouseClick(w.chat_view.attacher.button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.banner.isVisible())
    assert w.banner.label.text() == (
        "This model's projector reads images only: it cannot take audio"
    )
    assert w.chat_view.attacher.items() == []
