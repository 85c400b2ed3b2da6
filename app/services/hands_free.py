"""Hands-free: a conversation by voice, turn after turn, with no button pressed.

listening -> (speech heard, then the hangover's silence: `TurnDetector`) -> transcribing ->
the transcript sent -> answering (the answer streams and is read aloud) -> when the reading
ends, listening again. The microphone is off while the answer is spoken, so the app does not
hear its own voice. Qt-free: the window's adapter (app/ui/hands_free.py) starts and stops the
recorder, passes its PCM to `audio`, runs the transcription off the GUI thread and tells
`transcribed`, and tells `answer_done` when the reading of the answer ended.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol

import numpy as np

from app.services.turn_detector import TurnDetector, TurnRules

HandsFreeState = Literal["off", "listening", "hearing", "transcribing", "answering"]


class HandsFreePorts(Protocol):
    def listen(self) -> None:
        """Start the microphone (its PCM comes to `HandsFree.audio`)."""

    def mute(self) -> None:
        """Stop the microphone."""

    def transcribe(self, samples: np.ndarray, rate: int) -> None:
        """Transcribe a turn off the GUI thread; tell `HandsFree.transcribed`."""

    def send(self, text: str) -> bool:
        """Send the transcript as the user's message; False if the chat refused it."""

    def state_changed(self, state: HandsFreeState) -> None: ...


class HandsFree:
    def __init__(
        self,
        ports: HandsFreePorts,
        rate: int,
        *,
        rules: TurnRules | None = None,
        detector: Callable[[int, TurnRules | None], TurnDetector] = TurnDetector,
    ) -> None:
        self._ports = ports
        self._detector = detector(rate, rules)
        self._state: HandsFreeState = "off"

    @property
    def state(self) -> HandsFreeState:
        return self._state

    @property
    def on(self) -> bool:
        return self._state != "off"

    def start(self) -> None:
        if self._state == "off":
            self._listen()

    def stop(self) -> None:
        if self._state in ("listening", "hearing"):
            self._ports.mute()
        self._set("off")

    def audio(self, pcm: bytes | np.ndarray) -> None:
        """The microphone's PCM (int16 mono at the rate given)."""
        if self._state not in ("listening", "hearing"):
            return
        for event in self._detector.feed(pcm):
            if event == "speech":
                self._set("hearing")
            elif event == "end":
                self._ports.mute()
                self._set("transcribing")
                self._ports.transcribe(self._detector.turn, self._detector.turn_rate)
                return

    def transcribed(self, text: str | None) -> None:
        """The turn's transcript (None or blank: nothing understood, listen again)."""
        if self._state != "transcribing":
            return
        text = (text or "").strip()
        if text and self._ports.send(text):
            self._set("answering")
        else:
            self._listen()

    def answer_done(self) -> None:
        """The answer was spoken (or failed, or was stopped): the next turn."""
        if self._state == "answering":
            self._listen()

    def _listen(self) -> None:
        self._detector.reset()
        self._set("listening")
        self._ports.listen()

    def _set(self, state: HandsFreeState) -> None:
        if state != self._state:
            self._state = state
            self._ports.state_changed(state)


__all__ = ["HandsFree", "HandsFreePorts", "HandsFreeState"]
