"""Read aloud in the chat view (offscreen), on Qt TextToSpeech's own test engine ("mock",
which goes through Speaking and Ready for each utterance without a sound): the Read aloud
action on a finished answer speaks its sentences, code and citations left out; auto-read
speaks an answer as it streams; a new question or another chat stops it; pause, resume and
stop from the bar."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QObject, Qt
from pytestqt.qtbot import QtBot

from app.services.chat_settings import AUTO_READ_KEY, ChatSettings
from app.services.chat_store import ChatStore
from app.services.read_aloud import ReadAloud, VoiceSettings
from app.ui.chat_model import ChatModel
from app.ui.chat_settings import ChatSettingsPanel
from app.ui.chat_view import ChatView
from app.ui.read_aloud import ReadAloudController, SpeechBar
from app.ui.speech_voices import Speaker, SystemVoice
from app.ui.voice_settings import SAMPLE, VoiceSettingsPanel
from engine.speech.sentences import SentenceSplitter
from tests.app.ui.model_window import close_window

pytestmark = pytest.mark.qt_log_ignore(
    "This plugin does not support propagateSizeHints",
    "qt.multimedia.symbolsresolver",  # no PipeWire library on a bare machine
)

ANSWER = (
    "The tower was finished in 1889. It is 330 metres tall [1].\n\n"
    "```python\nheight = 330  # not spoken\n```\n\n"
    "Visitors can climb it. The view is **wide**."
)


def mock_voice(queue: ReadAloud, settings: VoiceSettings, parent: QObject | None) -> Speaker:
    return SystemVoice(queue, settings, engine="mock", parent=parent)


def sentences(text: str) -> list[str]:
    s = SentenceSplitter()
    return [x for x in s.feed(text) + s.flush() if x.strip()]


class Setup:
    def __init__(self, qtbot: QtBot, auto: bool = False) -> None:
        self.auto = auto
        self.chat = ChatModel()
        self.view = ChatView(self.chat)
        qtbot.addWidget(self.view)
        self.reader = ReadAloudController(
            self.chat,
            self.view,
            VoiceSettings(engine="system", rate=2.0),
            auto_read=lambda: self.auto,
            make=mock_voice,
        )
        self.bar = SpeechBar(self.reader)
        self.said: list[str] = []
        self.reader.voice.uttered.connect(lambda text, _audio: self.said.append(text))

    def close(self) -> None:
        self.reader.close()


@pytest.fixture
def setup(qtbot: QtBot) -> Iterator[Setup]:
    s = Setup(qtbot)
    yield s
    s.close()


def test_read_aloud_on_a_finished_answer_speaks_its_sentences(setup: Setup, qtbot: QtBot) -> None:
    chat, view = setup.chat, setup.view
    chat.append("user", "Tell me about the tower.")
    chat.append("assistant", ANSWER)
    answer = view.message_widgets[1]
    assert view.message_widgets[0].read_aloud_button.isHidden()  # questions are not read
    assert answer.read_aloud_button in answer.offered_actions()
    with qtbot.waitSignal(setup.reader.finished, timeout=30_000) as done:
        answer.read_aloud_button.click()
        assert answer.read_aloud_button.text() == "Stop reading"
        assert setup.bar.isVisibleTo(setup.bar.parentWidget() or setup.bar)
        assert setup.reader.state == "speaking"
    assert done.args == [chat.message(1).id]
    assert setup.said == sentences(ANSWER)
    assert setup.said[0] == "The tower was finished in 1889."
    assert not any("330  #" in s or "[1]" in s for s in setup.said)
    assert answer.read_aloud_button.text() == "Read aloud"
    assert setup.reader.state == "idle" and setup.bar.isHidden()


def test_stop_reading_from_the_answer_and_pause_from_the_bar(setup: Setup, qtbot: QtBot) -> None:
    chat, view, reader = setup.chat, setup.view, setup.reader
    chat.append("assistant", "One sentence here. Another one there. And a third one.")
    button = view.message_widgets[0].read_aloud_button
    button.click()
    setup.bar.pause_button.click()
    assert reader.state == "paused" and setup.bar.pause_button.text() == "Resume"
    setup.bar.pause_button.click()
    assert reader.state == "speaking" and setup.bar.pause_button.text() == "Pause"
    button.click()  # "Stop reading"
    assert reader.state == "idle" and button.text() == "Read aloud"
    qtbot.wait(50)
    assert setup.said == ["One sentence here."]  # nothing more after the stop


def test_auto_read_speaks_the_answer_as_it_streams(qtbot: QtBot) -> None:
    s = Setup(qtbot, auto=True)
    try:
        chat = s.chat
        chat.append("user", "Tell me about the tower.")
        row = chat.append("assistant", "", state="streaming")
        assert s.reader.state == "speaking"
        cut = ANSWER.index("It is")
        chat.append_text(row, ANSWER[:cut])
        chat.append_text(row, ANSWER[cut : cut + 6])
        # The first sentence was handed to the voice before the answer was done.
        qtbot.waitUntil(lambda: s.said == ["The tower was finished in 1889."], timeout=10_000)
        assert chat.message(row).state == "streaming"
        chat.append_text(row, ANSWER[cut + 6 :])
        with qtbot.waitSignal(s.reader.finished, timeout=30_000):
            chat.set_state(row, "done")
        assert s.said == sentences(ANSWER)
    finally:
        s.close()


def test_a_new_question_or_another_chat_stops_the_reading(qtbot: QtBot) -> None:
    s = Setup(qtbot, auto=True)
    try:
        chat = s.chat
        row = chat.append("assistant", "", state="streaming")
        chat.append_text(row, "A first sentence. A second one. ")
        assert s.reader.state == "speaking"
        chat.append("user", "Something else?")
        assert s.reader.state == "idle"
        row = chat.append("assistant", "", state="streaming")
        chat.append_text(row, "Another answer. More")
        assert s.reader.state == "speaking"
        chat.clear()  # a new chat
        assert s.reader.state == "idle"
        s.auto = False
        chat.append("assistant", "", state="streaming")
        assert s.reader.state == "idle"  # auto-read off: nothing read
    finally:
        s.close()


def test_stopping_the_answer_stops_its_reading(qtbot: QtBot) -> None:
    s = Setup(qtbot, auto=True)
    try:
        row = s.chat.append("assistant", "", state="streaming")
        s.chat.append_text(row, "A first sentence. A second one. ")
        s.chat.set_state(row, "stopped")
        assert s.reader.state == "idle"
    finally:
        s.close()


def test_auto_read_is_a_setting_of_the_chat(qtbot: QtBot, tmp_path: Path) -> None:
    store = ChatStore(tmp_path / "chats.db")
    try:
        panel = ChatSettingsPanel(store)
        qtbot.addWidget(panel)
        assert not panel.auto_read.isChecked()
        with qtbot.waitSignal(panel.changed) as changed:
            panel.auto_read.setChecked(True)
        assert changed.args[0][AUTO_READ_KEY] is True
        assert panel.chat_settings().auto_read
        # Another chat's settings: its own auto-read, no change told.
        with qtbot.assertNotEmitted(panel.changed):
            panel.set_settings({})
        assert not panel.auto_read.isChecked()
        panel.set_settings({AUTO_READ_KEY: True})
        assert panel.auto_read.isChecked()
        # Kept with the conversation in the store.
        c = store.create_conversation()
        store.replace_settings(c.id, changed.args[0])
        assert ChatSettings.from_stored(store.conversation(c.id).settings).auto_read
    finally:
        store.close()


def test_the_voice_panel_picks_engine_voice_and_rate(qtbot: QtBot, tmp_path: Path) -> None:
    panel = VoiceSettingsPanel(
        VoiceSettings(engine="local", voice="espeak-de", rate=1.5),
        local_voices=lambda: ["default", "espeak-de"],
        system_voices=lambda: ([], "The system voice cannot speak: no speech-dispatcher"),
        stt_model=lambda: None,
    )
    qtbot.addWidget(panel)
    # Nothing is listed (espeak-ng loaded, a speech service started) until it is shown.
    assert panel.voice.count() == 0
    assert panel.settings() == VoiceSettings(engine="local", voice="espeak-de", rate=1.5)
    panel.show()
    assert [panel.voice.itemText(i) for i in range(panel.voice.count())] == [
        "default",
        "espeak-de",
    ]
    assert panel.voice.currentText() == "espeak-de" and panel.rate_label.text() == "1.50x"
    assert "Models page" in panel.stt_label.text()
    with qtbot.waitSignal(panel.changed) as changed:
        panel.rate.setValue(80)
    assert changed.args == [VoiceSettings(engine="local", voice="espeak-de", rate=0.8)]
    with qtbot.waitSignal(panel.changed) as changed:
        panel.engine.setCurrentIndex(panel.engine.findData("system"))
    assert changed.args == [VoiceSettings(engine="system", voice="", rate=0.8)]
    # A system without a speech service: said in one line, the panel still usable.
    assert panel.problem.isVisibleTo(panel)
    assert panel.problem.text() == "The system voice cannot speak: no speech-dispatcher"
    with qtbot.waitSignal(panel.sample_requested) as sample:
        panel.sample_button.click()
    assert sample.args == [SAMPLE]


@pytest.mark.qt_log_ignore(
    'Text-to-speech plug-in "none-such" is not supported',
    "This plugin does not support propagateSizeHints",
)
def test_a_system_voice_that_cannot_speak_fails_in_one_line(setup: Setup, qtbot: QtBot) -> None:
    reader = setup.reader
    errors: list[str] = []
    reader.error.connect(errors.append)
    missing = SystemVoice(reader.queue, VoiceSettings(engine="system"), engine="none-such")
    reader.queue.set_voice(missing)
    assert missing.problem is not None
    setup.chat.append("assistant", "Hello there. Bye now.")
    reader.read_row(0)
    qtbot.waitUntil(lambda: reader.state == "idle")
    assert len(errors) == 1 and "\n" not in errors[0]
    assert errors[0] == missing.problem
    assert setup.view.message_widgets[0].read_aloud_button.text() == "Read aloud"
    missing.deleteLater()


def test_the_window_gives_reading_its_keys(qtbot: QtBot) -> None:
    """Ctrl+Alt+P pauses and resumes, Ctrl+Alt+S stops: window-wide, whichever widget has
    the focus; Ctrl+Alt+H is hands-free's."""
    from app.main import build_window

    w = build_window()
    try:
        actions = {a.text(): a for a in w.actions()}
        for text, keys in (
            ("Pause or resume reading aloud", "Ctrl+Alt+P"),
            ("Stop reading aloud", "Ctrl+Alt+S"),
            ("Hands-free", "Ctrl+Alt+H"),
        ):
            assert actions[text].shortcut().toString() == keys
            assert actions[text].shortcutContext() == Qt.ShortcutContext.WindowShortcut
        reader = w.findChild(ReadAloudController)
        assert reader is not None
        reader.queue.set_voice(mock_voice(reader.queue, VoiceSettings(rate=2.0), reader))
        reader.say("One sentence. Another one. And a third.")
        assert reader.state == "speaking"
        actions["Pause or resume reading aloud"].trigger()
        assert reader.state == "paused"
        actions["Pause or resume reading aloud"].trigger()
        assert reader.state == "speaking"
        actions["Stop reading aloud"].trigger()
        assert reader.state == "idle"
    finally:
        close_window(w)
