"""espeak-ng: the voice that is always there (`default`), offline, in every language it has.

The library comes with the app: the `espeakng-loader` wheel ships libespeak-ng and its data,
so a machine without the espeak-ng package speaks too. Its Python bindings on PyPI only
phonemise (phonemizer, kokoro-onnx), so synthesis is called here through ctypes: the
synchronous output mode hands each block of samples to a callback on the calling thread.
The library keeps one voice and one rate for the whole process, so every call holds a lock.

Where the wheel is missing (a bundle built without it), the `espeak-ng` command is used when
the system has one; it writes a WAV to stdout.
"""

from __future__ import annotations

import ctypes
import io
import shutil
import subprocess
import threading
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import EngineError
from engine.speech.pcm import Pcm

# espeak-ng's rate in words per minute at speed 1.0 (its own default), and the slowest it
# speaks: a slower rate is taken as this one, so it is refused instead.
WORDS_PER_MINUTE = 175
MIN_WPM = 80
MAX_SPEED = 4.0
MIN_SPEED = MIN_WPM / WORDS_PER_MINUTE

# speak_lib.h
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_DONT_EXIT = 0x8000  # a missing data file is an error code, not exit()
_RATE = 1
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_END_PAUSE = 0x1000
_SYNTH_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p
)


class _EspeakVoiceStruct(ctypes.Structure):
    _fields_ = (
        ("name", ctypes.c_char_p),
        ("languages", ctypes.c_void_p),  # (priority byte, name, NUL)*, then a NUL
        ("identifier", ctypes.c_char_p),
        ("gender", ctypes.c_ubyte),
        ("age", ctypes.c_ubyte),
        ("variant", ctypes.c_ubyte),
        ("xx1", ctypes.c_ubyte),
        ("score", ctypes.c_int),
        ("spare", ctypes.c_void_p),
    )


@dataclass(frozen=True)
class EspeakVoice:
    language: str  # what espeak-ng selects the voice by: "en-us", "de", "cmn"
    name: str  # its own name: "English_(America)"


class Espeak:
    """Synthesis through one espeak-ng: the bundled library, else the command."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lib: Any = None
        self._rate = 0
        self._blocks: list[np.ndarray[Any, np.dtype[np.int16]]] = []
        self._callback = _SYNTH_CALLBACK(self._on_samples)  # kept: C holds the pointer
        self._command = shutil.which("espeak-ng")
        self._problem: str | None = None
        self._voices: list[EspeakVoice] | None = None

    @property
    def source(self) -> str:
        """Which espeak-ng speaks: "library", "command", or "" when neither is here."""
        with self._lock:
            if self._open():
                return "library"
        return "command" if self._command else ""

    def voices(self) -> list[EspeakVoice]:
        with self._lock:
            if self._voices is None:
                self._voices = self._list_library() if self._open() else self._list_command()
            return list(self._voices)

    def synthesize(self, text: str, language: str, speed: float) -> Pcm:
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise EngineError(
                f"espeak-ng speaks at speeds from {MIN_SPEED:.2f} to {MAX_SPEED:g}, not {speed:g}"
            )
        wpm = round(WORDS_PER_MINUTE * speed)
        with self._lock:
            if self._open():
                return self._synth_library(text, language, wpm)
        if self._command:
            return self._synth_command(text, language, wpm)
        raise EngineError(f"no espeak-ng to speak with: {self._problem or 'not installed'}")

    # The library

    def _open(self) -> bool:
        """Loads and initialises the bundled library once (under the lock)."""
        if self._lib is not None:
            return True
        if self._problem is not None:
            return False
        try:
            import espeakng_loader  # type: ignore[import-untyped]

            lib = ctypes.CDLL(espeakng_loader.get_library_path())
            data_parent = Path(espeakng_loader.get_data_path()).parent
        except (ImportError, OSError, RuntimeError) as e:
            self._problem = f"the espeak-ng library did not load: {e}"
            return False
        lib.espeak_Initialize.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int)
        lib.espeak_SetVoiceByName.argtypes = (ctypes.c_char_p,)
        lib.espeak_SetParameter.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int)
        lib.espeak_Synth.argtypes = (
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        )
        lib.espeak_ListVoices.restype = ctypes.POINTER(ctypes.POINTER(_EspeakVoiceStruct))
        lib.espeak_ListVoices.argtypes = (ctypes.c_void_p,)
        rate = lib.espeak_Initialize(
            _AUDIO_OUTPUT_SYNCHRONOUS,
            0,
            str(data_parent).encode(),
            _INITIALIZE_DONT_EXIT,
        )
        if rate <= 0:
            self._problem = f"espeak-ng found no data in {data_parent}"
            return False
        lib.espeak_SetSynthCallback(self._callback)
        self._lib, self._rate = lib, rate
        return True

    def _on_samples(self, wav: Any, count: int, events: Any) -> int:
        if wav and count > 0:
            self._blocks.append(np.ctypeslib.as_array(wav, shape=(count,)).copy())
        return 0  # go on

    def _synth_library(self, text: str, language: str, wpm: int) -> Pcm:
        lib = self._lib
        if lib.espeak_SetVoiceByName(language.encode()) != 0:
            raise EngineError(f"espeak-ng has no voice for {language!r}")
        lib.espeak_SetParameter(_RATE, wpm, 0)
        data = text.encode() + b"\0"
        self._blocks = []
        err = lib.espeak_Synth(
            data, len(data), 0, _POS_CHARACTER, 0, _CHARS_UTF8 | _END_PAUSE, None, None
        )
        blocks, self._blocks = self._blocks, []
        if err != 0:
            raise EngineError(f"espeak-ng failed to speak (error {err})")
        samples = np.concatenate(blocks) if blocks else np.zeros(0, np.int16)
        return Pcm(samples.astype(np.int16, copy=False), self._rate)

    def _list_library(self) -> list[EspeakVoice]:
        found: dict[str, EspeakVoice] = {}
        table = self._lib.espeak_ListVoices(None)
        i = 0
        while table[i]:
            v = table[i].contents
            language = _first_language(v.languages)
            if language and v.name and not (v.identifier or b"").startswith(b"mb/"):
                found.setdefault(language, EspeakVoice(language, v.name.decode()))
            i += 1
        return sorted(found.values(), key=lambda v: v.language)

    # The command

    def _synth_command(self, text: str, language: str, wpm: int) -> Pcm:
        assert self._command is not None
        try:
            run = subprocess.run(
                [self._command, "--stdout", "--stdin", "-b", "1", "-v", language, "-s", str(wpm)],
                input=text.encode(),
                capture_output=True,
                timeout=120,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise EngineError(f"espeak-ng did not run: {e}") from None
        if run.returncode != 0 or not run.stdout:
            why = run.stderr.decode(errors="replace").strip().splitlines()
            raise EngineError(f"espeak-ng failed: {why[0] if why else run.returncode}")
        with wave.open(io.BytesIO(run.stdout)) as w:
            rate, frames = w.getframerate(), w.readframes(w.getnframes())
        return Pcm(np.frombuffer(frames, dtype="<i2").astype(np.int16), rate)

    def _list_command(self) -> list[EspeakVoice]:
        if not self._command:
            return []
        try:
            run = subprocess.run(
                [self._command, "--voices"], capture_output=True, timeout=30, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return []
        found: dict[str, EspeakVoice] = {}
        for line in run.stdout.decode(errors="replace").splitlines()[1:]:
            cols = line.split()  # Pty Language Age/Gender VoiceName File [Other Languages]
            if len(cols) >= 5 and not cols[4].startswith("mb/"):
                found.setdefault(cols[1], EspeakVoice(cols[1], cols[3]))
        return sorted(found.values(), key=lambda v: v.language)


def _first_language(pointer: int | None) -> str:
    """The first of a voice's languages: after its priority byte, up to the NUL."""
    if not pointer:
        return ""
    raw = ctypes.string_at(pointer + 1)
    return raw.decode(errors="replace")
