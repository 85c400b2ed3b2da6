"""The end of a spoken turn, found in a microphone's PCM: voice-activity detection with a
hangover.

Each 30 ms frame is classified by WebRTC's voice-activity detector (the `webrtcvad-wheels`
package: Google's GMM detector, which tells speech from steady noise by its spectrum, and a
wheel with no model to download). Its noise model adapts, and after loud speech it takes a
quiet room's hiss for speech (white noise at -60 dBFS, measured), which would keep a turn
open for ever; so a frame counts as speech only when it is also louder than a floor: an
absolute -50 dBFS, and 10 dB over the quietest frame of the last two seconds (the room's
own noise). A turn starts once most frames of a short
window are speech (a cough or a click does not start one), and ends when a longer window
holds almost no speech: the hangover, which lets a speaker pause between phrases. A turn
that runs on past `max_turn_s` ends there.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Final, Literal

import numpy as np
import webrtcvad

from app.services.voice_clip import resample

# The rates WebRTC's detector reads; other input is resampled to 16 kHz.
VAD_RATES: Final = (8000, 16000, 32000, 48000)
FRAME_MS: Final = 30

TurnEvent = Literal["speech", "end"]


@dataclass(frozen=True)
class TurnRules:
    aggressiveness: int = 2  # 0 (lets most through) .. 3 (strictest about what is speech)
    floor_dbfs: float = -50.0  # a frame quieter than this is no speech
    over_noise_db: float = 10.0  # ...nor one this close to the room's noise
    noise_window_ms: int = 2000  # where the room's noise is taken from
    start_ms: int = 240  # the window that starts a turn: most of it speech
    hangover_ms: int = 900  # the silence that ends one
    max_turn_s: float = 30.0
    start_share: float = 0.7  # of the start window's frames voiced
    end_share: float = 0.1  # at most this share of the hangover's frames voiced


class TurnDetector:
    """Feed int16 mono PCM as it is recorded; `feed` tells when speech starts and when the
    turn ends. `turn` holds the turn's samples (from just before speech was heard)."""

    def __init__(self, rate: int, rules: TurnRules | None = None) -> None:
        if rate <= 0:
            raise ValueError(f"a sample rate must be positive, not {rate}")
        self.rules = rules or TurnRules()
        self.rate = rate
        self._vad_rate = rate if rate in VAD_RATES else 16000
        self._vad = webrtcvad.Vad(self.rules.aggressiveness)
        self._frame = self._vad_rate * FRAME_MS // 1000
        self._pending = np.zeros(0, dtype=np.int16)  # resampled, not yet a whole frame
        self._start = deque[bool](maxlen=max(1, self.rules.start_ms // FRAME_MS))
        self._end = deque[bool](maxlen=max(1, self.rules.hangover_ms // FRAME_MS))
        self._pre: deque[np.ndarray] = deque(maxlen=self._start.maxlen)
        self._quiet = deque[float](maxlen=max(1, self.rules.noise_window_ms // FRAME_MS))
        self._floor = 32768.0 * 10 ** (self.rules.floor_dbfs / 20)
        self._over = 10 ** (self.rules.over_noise_db / 20)
        self._turn: list[np.ndarray] = []
        self._in_speech = False
        self._frames = 0

    @property
    def in_speech(self) -> bool:
        return self._in_speech

    @property
    def turn(self) -> np.ndarray:
        """The turn's samples at the detector's rate (16 kHz unless given a VAD rate)."""
        return np.concatenate(self._turn) if self._turn else np.zeros(0, dtype=np.int16)

    @property
    def turn_rate(self) -> int:
        return self._vad_rate

    def reset(self) -> None:
        """Listen for a new turn."""
        self._pending = np.zeros(0, dtype=np.int16)
        self._start.clear()
        self._end.clear()
        self._pre.clear()
        self._quiet.clear()
        self._turn = []
        self._in_speech = False
        self._frames = 0

    def feed(self, pcm: bytes | np.ndarray) -> list[TurnEvent]:
        samples = np.frombuffer(pcm, dtype=np.int16) if isinstance(pcm, bytes) else pcm
        if self.rate != self._vad_rate and samples.size:
            # Each block alone (its edges may click, which the detector does not mind).
            y = resample(samples.astype(np.float32) / 32768.0, self.rate, self._vad_rate)
            samples = np.clip(np.round(y * 32767.0), -32768, 32767).astype(np.int16)
        buf = np.concatenate([self._pending, samples.astype(np.int16, copy=False)])
        events: list[TurnEvent] = []
        whole = buf.size // self._frame * self._frame
        for i in range(0, whole, self._frame):
            event = self._frame_in(buf[i : i + self._frame])
            if event is not None:
                events.append(event)
                if event == "end":
                    self._pending = np.zeros(0, dtype=np.int16)
                    return events  # what follows belongs to no turn until `reset`
        self._pending = buf[whole:]
        return events

    def _frame_in(self, frame: np.ndarray) -> TurnEvent | None:
        rms = float(np.sqrt(np.mean(np.square(frame, dtype=np.float64))))
        self._quiet.append(rms)
        loud = rms >= self._floor and rms >= self._over * min(self._quiet)
        voiced = loud and self._vad.is_speech(frame.tobytes(), self._vad_rate)
        r = self.rules
        if not self._in_speech:
            self._start.append(voiced)
            self._pre.append(frame)
            full = len(self._start) == self._start.maxlen
            if full and sum(self._start) >= r.start_share * len(self._start):
                self._in_speech = True
                self._turn = list(self._pre)
                self._frames = len(self._turn)
                self._end.clear()
                return "speech"
            return None
        self._turn.append(frame)
        self._frames += 1
        self._end.append(voiced)
        quiet = len(self._end) == self._end.maxlen and sum(self._end) <= r.end_share * len(
            self._end
        )
        too_long = self._frames * FRAME_MS >= r.max_turn_s * 1000
        if quiet or too_long:
            self._in_speech = False
            self._start.clear()  # the next turn is heard anew
            self._pre.clear()
            return "end"
        return None


__all__ = ["FRAME_MS", "TurnDetector", "TurnEvent", "TurnRules"]
