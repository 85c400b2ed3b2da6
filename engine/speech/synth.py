"""Speech synthesis: text in, 16-bit mono samples out, with the voices this machine has.

`default` always exists: espeak-ng in American English (engine.speech.espeak: its library
ships with the app). espeak-ng's other languages are `espeak-<language>` ("espeak-de",
"espeak-fr"). With the `voice` extra installed, Kokoro's neural voices are there too as
`kokoro-<voice>` ("kokoro-jf_alpha"; they speak Japanese).

    pcm = synthesize("Hello there.", voice="default", speed=1.0)   # Pcm(samples, rate)
    wav = to_wav(pcm)

Every call blocks until the whole text is spoken; call it off a GUI thread or an event loop.
Speech engines keep process-wide state, so calls to one engine run one at a time.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from engine.errors import EngineError
from engine.speech import kokoro_voice
from engine.speech.espeak import Espeak
from engine.speech.kokoro_voice import Kokoro
from engine.speech.pcm import Pcm, to_pcm_bytes, to_wav

DEFAULT_VOICE = "default"
DEFAULT_LANGUAGE = "en-us"
ESPEAK_PREFIX = "espeak-"


@dataclass(frozen=True)
class Voice:
    name: str  # what `synthesize` takes
    engine: str  # "espeak-ng" or "kokoro"
    language: str  # "en-us", "ja"
    description: str  # for a person: "English (America), espeak-ng"
    min_speed: float
    max_speed: float


class UnknownVoice(EngineError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no voice named {name!r} on this machine")
        self.name = name


class SpeedOutOfRange(EngineError):
    pass


class Synthesizer:
    """The voices of espeak-ng and, when installed, Kokoro; each engine made once."""

    def __init__(self) -> None:
        self.espeak = Espeak()
        self.kokoro = Kokoro()
        self._lock = threading.Lock()
        self._voices: dict[str, Voice] | None = None

    def voices(self) -> list[Voice]:
        with self._lock:
            if self._voices is None:
                self._voices = {v.name: v for v in self._discover()}
            return list(self._voices.values())

    def voice(self, name: str) -> Voice:
        """The voice called `name`; UnknownVoice when there is none."""
        found = next((v for v in self.voices() if v.name == name), None)
        if found is None:
            raise UnknownVoice(name)
        return found

    def synthesize(self, text: str, voice: str = DEFAULT_VOICE, speed: float = 1.0) -> Pcm:
        """`text` spoken by `voice` at `speed` (1.0: the voice's own pace)."""
        v = self.voice(voice)
        if not v.min_speed <= speed <= v.max_speed:
            raise SpeedOutOfRange(
                f"voice {v.name!r} speaks at speeds from {v.min_speed:.2f} to "
                f"{v.max_speed:g}, not {speed:g}"
            )
        if v.engine == "kokoro":
            return self.kokoro.synthesize(text, v.name.removeprefix(kokoro_voice.PREFIX), speed)
        return self.espeak.synthesize(text, v.language, speed)

    def _discover(self) -> list[Voice]:
        from engine.speech import espeak

        out = [
            Voice(
                DEFAULT_VOICE,
                "espeak-ng",
                DEFAULT_LANGUAGE,
                "English (America), espeak-ng",
                espeak.MIN_SPEED,
                espeak.MAX_SPEED,
            )
        ]
        out += [
            Voice(
                ESPEAK_PREFIX + ev.language,
                "espeak-ng",
                ev.language,
                f"{ev.name.replace('_', ' ')}, espeak-ng",
                espeak.MIN_SPEED,
                espeak.MAX_SPEED,
            )
            for ev in self.espeak.voices()
        ]
        out += [
            Voice(
                kokoro_voice.PREFIX + name,
                "kokoro",
                "ja",
                f"Japanese, Kokoro-82M ({name})",
                kokoro_voice.MIN_SPEED,
                kokoro_voice.MAX_SPEED,
            )
            for name in self.kokoro.voices()
        ]
        return out


_shared: Synthesizer | None = None
_shared_lock = threading.Lock()


def synthesizer() -> Synthesizer:
    """The process's one synthesizer (espeak-ng's library is one per process)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Synthesizer()
        return _shared


def voices() -> list[str]:
    """The names of the voices `synthesize` takes, `default` first."""
    return [v.name for v in synthesizer().voices()]


def synthesize(text: str, voice: str = DEFAULT_VOICE, speed: float = 1.0) -> Pcm:
    """`text` spoken by `voice` at `speed`; UnknownVoice or SpeedOutOfRange (EngineErrors)
    for a voice or speed this machine has not, another EngineError if the engine fails."""
    return synthesizer().synthesize(text, voice, speed)


__all__ = [
    "DEFAULT_VOICE",
    "Pcm",
    "SpeedOutOfRange",
    "Synthesizer",
    "UnknownVoice",
    "Voice",
    "synthesize",
    "synthesizer",
    "to_pcm_bytes",
    "to_wav",
    "voices",
]
