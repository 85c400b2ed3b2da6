"""Answers read aloud, sentence by sentence, while they stream: the queue and its states.

An answer's text comes in as deltas (`feed`), is cut into sentences by the engine's
`SentenceSplitter` (which leaves out code blocks, citations and Markdown marks), and each
sentence goes to the voice once the one before it has been spoken. Qt-free: the window's
voices (app/ui/speech_voices.py: the system's through Qt TextToSpeech, the local engine's
through Qt Multimedia) are thin adapters of `Voice`, and tell `spoken(token)` when an
utterance ends. Each utterance has a token, so a late "done" from an utterance that was
stopped cannot move the queue on.

States: idle (nothing to say), speaking (an utterance out, or waiting for the answer's
next sentence), paused (the voice holds its place; nothing new starts until `resume`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Final, Literal, Protocol

from engine.speech.sentences import SentenceSplitter

ReadState = Literal["idle", "speaking", "paused"]
VoiceEngine = Literal["local", "system"]
ENGINES: Final[tuple[VoiceEngine, ...]] = ("local", "system")


class Voice(Protocol):
    """What reads one sentence at a time."""

    def speak(self, text: str, token: int) -> None:
        """Say `text`; tell the queue `spoken(token)` (or `failed`) when it ends."""

    def prepare(self, text: str) -> None:
        """`text` comes next: a voice that synthesises ahead may start on it."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def stop(self) -> None:
        """Silence now; nothing said so far is told as spoken."""


class NothingPlaying:
    """`pause`, `resume` and `stop` for what holds no sound to hold or silence: a voice not
    made yet, an output that writes each utterance whole at once. A `Voice` or an
    `AudioOut` (app/ui/speech_voices.py) of that kind inherits them."""

    def pause(self) -> None:
        """Nothing plays: nothing to hold."""

    def resume(self) -> None:
        """Nothing was held."""

    def stop(self) -> None:
        """Nothing sounds: nothing to silence."""


class ReadListener(Protocol):
    def state_changed(self, state: ReadState, source: str | None) -> None:
        """The queue went idle, speaking or paused; `source`: the answer read (its id)."""

    def finished(self, source: str) -> None:
        """Every sentence of the answer `source` was spoken (not told after a stop)."""

    def failed(self, message: str) -> None:
        """The voice could not speak (one line); the reading stopped."""


class Splitter(Protocol):
    def feed(self, delta: str) -> list[str]: ...

    def flush(self) -> list[str]: ...


@dataclass(frozen=True)
class VoiceSettings:
    """Which voice reads: the engine, its voice ('' for its default) and the rate (1.0 is
    the voice's normal speed). Kept in the app's settings as plain values."""

    engine: VoiceEngine = "local"
    voice: str = ""
    rate: float = 1.0

    MIN_RATE: ClassVar[float] = 0.5
    MAX_RATE: ClassVar[float] = 2.0

    def to_stored(self) -> dict[str, str]:
        return {"engine": self.engine, "voice": self.voice, "rate": f"{self.rate:g}"}

    @classmethod
    def from_stored(cls, stored: Mapping[str, object]) -> VoiceSettings:
        """Never raises: a settings file edited by hand falls back to the defaults."""
        engine = stored.get("engine")
        try:
            rate = float(str(stored.get("rate", 1.0)))
        except ValueError:
            rate = 1.0
        if math.isnan(rate):
            rate = 1.0
        return cls(
            engine="system" if engine == "system" else "local",
            voice=str(stored.get("voice") or ""),
            rate=min(max(rate, cls.MIN_RATE), cls.MAX_RATE),
        )


class ReadAloud:
    """One answer read at a time: a new one (or `stop`) silences the last."""

    def __init__(
        self,
        voice: Voice,
        listener: ReadListener | None = None,
        *,
        splitter: Callable[[], Splitter] = SentenceSplitter,
    ) -> None:
        self._voice = voice
        self._listener = listener
        self._new_splitter = splitter
        self._splitter: Splitter | None = None
        self._queue: deque[str] = deque()
        self._current: int | None = None  # the token of the utterance out
        self._token = 0
        self._source: str | None = None  # the answer being read
        self._open = False  # more of the answer may still come
        self._paused = False
        self._state: ReadState = "idle"
        self._prepared: tuple[int, str] | None = None  # the sentence a voice was told of

    @property
    def state(self) -> ReadState:
        return self._state

    @property
    def source(self) -> str | None:
        """The answer being read (None while idle)."""
        return self._source

    @property
    def pending(self) -> list[str]:
        """The sentences waiting for their turn."""
        return list(self._queue)

    def set_voice(self, voice: Voice) -> None:
        """Read with another voice from now on (what was being read stops)."""
        self.stop()
        self._voice = voice

    # -- the answer's text -----------------------------------------------------------------

    def start(self, source: str) -> None:
        """Read the answer `source` as it streams (`feed`, then `finish`)."""
        self.stop()
        self._source, self._open = source, True
        self._splitter = self._new_splitter()
        self._set_state("speaking")

    def feed(self, source: str, delta: str) -> None:
        """More of the answer's text; its whole sentences are queued."""
        if source != self._source or not self._open or self._splitter is None:
            return
        self._queue.extend(s for s in self._splitter.feed(delta) if s.strip())
        self._next()

    def finish(self, source: str) -> None:
        """The answer is complete: its last sentence is queued, and once everything is
        spoken the listener hears `finished`."""
        if source != self._source or not self._open or self._splitter is None:
            return
        self._queue.extend(s for s in self._splitter.flush() if s.strip())
        self._open = False
        self._next()

    def read(self, source: str, text: str) -> None:
        """Read a whole answer (Read aloud on a finished one)."""
        self.start(source)
        self.feed(source, text)
        self.finish(source)

    # -- controls --------------------------------------------------------------------------

    def stop(self) -> None:
        """Silence, and forget the rest of the answer."""
        if self._current is not None:
            self._voice.stop()
        self._current = None
        self._queue.clear()
        self._source, self._open, self._splitter, self._paused = None, False, None, False
        self._set_state("idle")

    def pause(self) -> None:
        if self._state == "speaking":
            self._paused = True
            if self._current is not None:
                self._voice.pause()
            self._set_state("paused")

    def resume(self) -> None:
        if self._state == "paused":
            self._paused = False
            self._set_state("speaking")
            if self._current is not None:
                self._voice.resume()
            else:
                self._next()

    def toggle_pause(self) -> None:
        if self._state == "paused":
            self.resume()
        else:
            self.pause()

    # -- what the voice tells --------------------------------------------------------------

    def spoken(self, token: int) -> None:
        """The utterance `token` ended (a stale token is ignored)."""
        if token != self._current:
            return
        self._current = None
        self._next()

    def failed(self, token: int, message: str) -> None:
        if token != self._current:
            return
        self._current = None
        self.stop()
        if self._listener is not None:
            self._listener.failed(message)

    def _next(self) -> None:
        if self._source is None:
            return
        if self._paused or self._current is not None:
            self._prepare_next()
            return
        if self._queue:
            self._token += 1
            self._current = token = self._token
            self._voice.speak(self._queue.popleft(), token)
            if self._current == token:
                self._prepare_next()
        elif not self._open:
            source = self._source
            self.stop()
            if self._listener is not None:
                self._listener.finished(source)

    def _prepare_next(self) -> None:
        """The sentence after the one out, once: a voice may synthesise it meanwhile."""
        if self._queue and self._prepared != (self._token, self._queue[0]):
            self._prepared = (self._token, self._queue[0])
            self._voice.prepare(self._queue[0])

    def _set_state(self, state: ReadState) -> None:
        if state != self._state:
            self._state = state
            if self._listener is not None:
                self._listener.state_changed(state, self._source)


__all__ = ["ENGINES", "ReadAloud", "ReadListener", "ReadState", "Voice", "VoiceSettings"]
