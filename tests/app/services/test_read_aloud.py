"""The read-aloud queue without Qt: the calls a voice gets, in order, as an answer streams;
stop and pause; a stale 'done'; the voice settings and a chat's auto-read kept."""

from __future__ import annotations

from app.services.chat_settings import AUTO_READ_KEY, ChatSettings
from app.services.read_aloud import ReadAloud, ReadState, VoiceSettings
from engine.speech.sentences import SentenceSplitter

ANSWER = (
    "Paris is the capital of France. It lies on the Seine [1].\n\n"
    "```python\nprint('not spoken')\n```\n\n"
    "Dr. Smith measured 3.14 metres! Is that **far**?"
)


class RecordingVoice:
    """A voice that records its calls; an utterance ends when the test says so."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.out: list[tuple[str, int]] = []  # utterances told to speak, in order

    def speak(self, text: str, token: int) -> None:
        self.calls.append(("speak", text))
        self.out.append((text, token))

    def prepare(self, text: str) -> None:
        self.calls.append(("prepare", text))

    def pause(self) -> None:
        self.calls.append(("pause", None))

    def resume(self) -> None:
        self.calls.append(("resume", None))

    def stop(self) -> None:
        self.calls.append(("stop", None))

    @property
    def spoken(self) -> list[str]:
        return [t for t, _ in self.out]


class Listener:
    def __init__(self) -> None:
        self.states: list[tuple[ReadState, str | None]] = []
        self.done: list[str] = []
        self.failures: list[str] = []

    def state_changed(self, state: ReadState, source: str | None) -> None:
        self.states.append((state, source))

    def finished(self, source: str) -> None:
        self.done.append(source)

    def failed(self, message: str) -> None:
        self.failures.append(message)


def _make() -> tuple[ReadAloud, RecordingVoice, Listener]:
    voice, listener = RecordingVoice(), Listener()
    return ReadAloud(voice, listener), voice, listener


def _finish_all(q: ReadAloud, voice: RecordingVoice) -> None:
    """Let every utterance end, one after the other, as a voice would."""
    told = 0
    while told < len(voice.out):
        q.spoken(voice.out[told][1])
        told += 1


def _expected(text: str) -> list[str]:
    s = SentenceSplitter()
    return [x for x in s.feed(text) + s.flush() if x.strip()]


def test_streamed_answer_is_spoken_sentence_by_sentence_in_order() -> None:
    q, voice, listener = _make()
    q.start("m1")
    assert q.state == "speaking" and voice.out == []
    for delta in ("Paris is the cap", "ital of France. It lies", " on the Seine [1].\n\n"):
        q.feed("m1", delta)
    # The first sentence went out as soon as it was whole; the second waits its turn.
    assert voice.spoken == ["Paris is the capital of France."]
    assert q.pending == ["It lies on the Seine."]
    assert ("prepare", "It lies on the Seine.") in voice.calls
    q.spoken(voice.out[0][1])
    assert voice.spoken[-1] == "It lies on the Seine."
    q.spoken(voice.out[1][1])
    # Waiting for more of the answer: still speaking, nothing finished.
    assert q.state == "speaking" and listener.done == []
    q.feed("m1", ANSWER[len("Paris is the capital of France. It lies on the Seine [1].\n\n") :])
    q.finish("m1")
    _finish_all(q, voice)
    assert voice.spoken == _expected(ANSWER)
    assert "print('not spoken')" not in " ".join(voice.spoken)
    assert voice.spoken[-2:] == ["Dr. Smith measured 3.14 metres!", "Is that far?"]
    assert listener.done == ["m1"]
    assert q.state == "idle"
    assert listener.states[0] == ("speaking", "m1") and listener.states[-1][0] == "idle"


def test_the_same_sentences_whatever_the_deltas() -> None:
    for size in (1, 3, 7, len(ANSWER)):
        q, voice, _ = _make()
        q.start("m")
        for i in range(0, len(ANSWER), size):
            q.feed("m", ANSWER[i : i + size])
        q.finish("m")
        _finish_all(q, voice)
        assert voice.spoken == _expected(ANSWER), size


def test_read_a_finished_answer() -> None:
    q, voice, listener = _make()
    q.read("m2", "One. Two. Three.")
    assert voice.spoken == ["One."]
    _finish_all(q, voice)
    assert voice.spoken == ["One.", "Two.", "Three."]
    assert listener.done == ["m2"]


def test_stop_silences_and_forgets_the_rest() -> None:
    q, voice, listener = _make()
    q.read("m", "One. Two. Three.")
    stale = voice.out[0][1]
    q.stop()
    assert voice.calls[-1] == ("stop", None)
    assert q.state == "idle" and q.pending == [] and q.source is None
    q.spoken(stale)  # the voice's late "done" for the utterance stopped
    q.feed("m", "More text. ")
    assert voice.spoken == ["One."]
    assert listener.done == []  # a stopped reading did not finish


def test_a_new_answer_stops_the_one_being_read() -> None:
    q, voice, listener = _make()
    q.read("a", "First answer. Still first.")
    first = voice.out[0][1]
    q.start("b")
    assert ("stop", None) in voice.calls
    q.spoken(first)  # late, from the first answer
    q.feed("a", "Ignored. ")  # deltas of the old answer go nowhere
    q.feed("b", "Second answer. Then more")
    assert voice.spoken == ["First answer.", "Second answer."]
    q.finish("b")
    _finish_all(q, voice)
    assert listener.done == ["b"]


def test_pause_holds_the_utterance_and_the_queue() -> None:
    q, voice, listener = _make()
    q.read("m", "One. Two.")
    q.pause()
    assert q.state == "paused" and voice.calls[-1] == ("pause", None)
    q.spoken(voice.out[0][1])  # a voice that ends its sentence at the pause
    assert voice.spoken == ["One."]  # nothing new starts while paused
    q.resume()
    assert q.state == "speaking"
    assert voice.spoken == ["One.", "Two."]  # the queue went on; no utterance to resume
    q.pause()
    q.resume()
    assert voice.calls[-1] == ("resume", None)
    _finish_all(q, voice)
    assert listener.done == ["m"]
    assert [s for s, _ in listener.states] == [
        "speaking",
        "paused",
        "speaking",
        "paused",
        "speaking",
        "idle",
    ]


def test_toggle_and_pause_while_idle() -> None:
    q, voice, _ = _make()
    q.pause()
    assert q.state == "idle" and voice.calls == []
    q.read("m", "Hello there.")
    q.toggle_pause()
    assert q.state == "paused"
    q.toggle_pause()
    assert q.state == "speaking"


def test_pause_while_waiting_for_the_stream() -> None:
    q, voice, _ = _make()
    q.start("m")
    q.pause()
    assert ("pause", None) not in voice.calls  # nothing was out to pause
    q.feed("m", "A whole sentence. And more")
    assert voice.spoken == []
    q.resume()
    assert voice.spoken == ["A whole sentence."]


def test_a_failing_voice_stops_with_its_message() -> None:
    q, voice, listener = _make()
    q.read("m", "One. Two.")
    q.failed(voice.out[0][1], "No audio output device to speak on")
    assert q.state == "idle"
    assert listener.failures == ["No audio output device to speak on"]
    assert voice.spoken == ["One."]
    q.failed(99, "stale")
    assert listener.failures == ["No audio output device to speak on"]


def test_an_answer_without_prose_finishes_at_once() -> None:
    q, voice, listener = _make()
    q.read("m", "```\ncode only\n```\n")
    assert voice.out == []
    assert listener.done == ["m"] and q.state == "idle"


def test_voice_settings_round_trip_and_bad_values() -> None:
    s = VoiceSettings(engine="system", voice="Anne", rate=1.5)
    assert VoiceSettings.from_stored(s.to_stored()) == s
    assert VoiceSettings.from_stored({}) == VoiceSettings()
    bad = VoiceSettings.from_stored({"engine": "nope", "rate": "fast", "voice": None})
    assert bad == VoiceSettings()
    assert VoiceSettings.from_stored({"rate": "9"}).rate == VoiceSettings.MAX_RATE
    assert VoiceSettings.from_stored({"rate": "nan"}).rate == 1.0


def test_auto_read_is_kept_with_the_chat() -> None:
    assert ChatSettings().auto_read is False
    assert AUTO_READ_KEY not in ChatSettings().to_stored()
    on = ChatSettings(auto_read=True)
    stored = on.to_stored()
    assert stored[AUTO_READ_KEY] is True
    assert ChatSettings.from_stored(stored).auto_read is True
    # Only a real true turns it on (an imported chat may hold anything).
    assert ChatSettings.from_stored({AUTO_READ_KEY: "yes"}).auto_read is False
    assert AUTO_READ_KEY not in ChatSettings.from_stored({AUTO_READ_KEY: 1}).extra
