"""Hands-free without Qt: the turn detector on speech espeak-ng says (with silence and a
click around it), and the turn-taking machine: listen, hear, transcribe, send, answer,
listen again."""

from __future__ import annotations

import numpy as np
import pytest

from app.services.hands_free import HandsFree, HandsFreeState
from app.services.turn_detector import TurnDetector, TurnRules
from app.services.voice_clip import RATE, resample
from engine.speech.synth import synthesize

QUESTION = "What is the capital of France? Tell me in one word."


def speech(text: str = QUESTION) -> np.ndarray:
    """`text` spoken by espeak-ng, as 16 kHz int16 (the microphone's format)."""
    pcm = synthesize(text)
    y = resample(pcm.samples.astype(np.float32) / 32768.0, pcm.rate, RATE)
    return np.clip(np.round(y * 32767.0), -32768, 32767).astype(np.int16)


def noise(seconds: float, level: float = 30.0, seed: int = 0) -> np.ndarray:
    """A quiet room: low white noise."""
    rng = np.random.default_rng(seed)
    return np.round(rng.normal(0.0, level, round(seconds * RATE))).astype(np.int16)


def chunks(x: np.ndarray, ms: int = 20) -> list[bytes]:
    n = RATE * ms // 1000
    return [x[i : i + n].tobytes() for i in range(0, x.size, n)]


@pytest.fixture(scope="module")
def spoken() -> np.ndarray:
    return speech()


def run(detector: TurnDetector, audio: np.ndarray) -> list[tuple[str, float]]:
    """Events with the time (seconds of audio fed) when each was told."""
    fed, events = 0, []
    for block in chunks(audio):
        fed += len(block) // 2
        events += [(e, fed / RATE) for e in detector.feed(block)]
    return events


# A quiet room's hiss, one that WebRTC's detector alone takes for speech after a loud
# phrase (-61 dBFS), and a louder one (-47 dBFS).
@pytest.mark.parametrize("hiss", [10.0, 30.0, 150.0])
def test_a_spoken_question_is_one_turn_ended_by_the_hangover(
    spoken: np.ndarray, hiss: float
) -> None:
    rules = TurnRules()
    lead, tail = 1.0, 2.5
    audio = np.concatenate([noise(lead, hiss), spoken, noise(tail, hiss, seed=1)])
    d = TurnDetector(RATE, rules)
    events = run(d, audio)
    assert [e for e, _ in events] == ["speech", "end"]
    (_, heard), (_, ended) = events
    speech_end = lead + spoken.size / RATE
    assert lead < heard < lead + 0.6  # soon after the first words
    # Ended after the hangover's silence, not before the speech did (espeak's own pauses
    # between the sentences did not end it).
    assert speech_end + rules.hangover_ms / 1000 * 0.5 <= ended
    assert ended <= speech_end + rules.hangover_ms / 1000 + 0.3
    turn = d.turn
    assert d.turn_rate == RATE
    # The turn holds the speech, from a little before it was heard.
    assert spoken.size <= turn.size <= spoken.size + (rules.hangover_ms + rules.start_ms) * 16 + 800
    assert np.abs(turn.astype(np.int32)).max() >= np.abs(spoken.astype(np.int32)).max() * 0.9


def test_noise_and_a_click_are_no_turn() -> None:
    d = TurnDetector(RATE)
    click = np.zeros(RATE // 10, dtype=np.int16)
    click[:40] = 20000
    assert run(d, np.concatenate([noise(2.0), click, noise(2.0, seed=2)])) == []
    assert not d.in_speech and d.turn.size == 0


def test_another_rate_is_resampled_and_a_long_turn_is_cut(spoken: np.ndarray) -> None:
    y = resample(spoken.astype(np.float32) / 32768.0, RATE, 44100)
    at44 = np.round(y * 32767.0).astype(np.int16)
    d = TurnDetector(44100, TurnRules(max_turn_s=1.0))
    events: list[str] = []
    step = 441  # 10 ms blocks
    for i in range(0, at44.size, step):
        events += d.feed(at44[i : i + step])
        if "end" in events:
            break
    assert events == ["speech", "end"]
    assert i + step < at44.size  # cut at a second, before the speech ended
    assert d.turn_rate == RATE
    assert RATE * 1.0 <= d.turn.size <= RATE * 1.0 + 240 * 16
    d.reset()
    assert d.turn.size == 0 and not d.in_speech
    with pytest.raises(ValueError, match="positive"):
        TurnDetector(0)


class Ports:
    def __init__(self, accept: bool = True) -> None:
        self.calls: list[str] = []
        self.turns: list[tuple[np.ndarray, int]] = []
        self.sent: list[str] = []
        self.states: list[HandsFreeState] = []
        self.accept = accept

    def listen(self) -> None:
        self.calls.append("listen")

    def mute(self) -> None:
        self.calls.append("mute")

    def transcribe(self, samples: np.ndarray, rate: int) -> None:
        self.calls.append("transcribe")
        self.turns.append((samples, rate))

    def send(self, text: str) -> bool:
        self.calls.append("send")
        self.sent.append(text)
        return self.accept

    def state_changed(self, state: HandsFreeState) -> None:
        self.states.append(state)


def test_turn_after_turn(spoken: np.ndarray) -> None:
    ports = Ports()
    hf = HandsFree(ports, RATE)
    assert hf.state == "off" and not hf.on
    hf.audio(spoken.tobytes())  # off: nothing heard
    hf.start()
    assert ports.calls == ["listen"] and hf.state == "listening"
    for block in chunks(np.concatenate([noise(0.5), spoken, noise(2.0)])):
        hf.audio(block)
    assert ports.calls == ["listen", "mute", "transcribe"]
    assert hf.state == "transcribing"
    samples, rate = ports.turns[0]
    assert rate == RATE and samples.size >= spoken.size
    hf.audio(spoken.tobytes())  # the microphone is off meanwhile: nothing more
    hf.answer_done()  # not answering yet: nothing
    assert hf.state == "transcribing"
    hf.transcribed("  Paris?  ")
    assert ports.sent == ["Paris?"] and hf.state == "answering"
    hf.transcribed("late")  # a second result for the same turn: ignored
    assert ports.sent == ["Paris?"]
    hf.answer_done()
    assert hf.state == "listening" and ports.calls[-1] == "listen"
    assert ports.states == ["listening", "hearing", "transcribing", "answering", "listening"]
    hf.stop()
    assert hf.state == "off" and ports.calls[-1] == "mute"


def test_nothing_understood_or_refused_listens_again(spoken: np.ndarray) -> None:
    for accept, text in ((True, ""), (True, None), (False, "Paris?")):
        ports = Ports(accept)
        hf = HandsFree(ports, RATE)
        hf.start()
        hf.audio(np.concatenate([spoken, noise(2.0)]))
        assert hf.state == "transcribing"
        hf.transcribed(text)
        assert hf.state == "listening" and ports.calls.count("listen") == 2
