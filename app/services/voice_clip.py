"""A microphone recording apart from Qt: the device's raw samples turned into 16 kHz mono
16-bit PCM, the level a meter shows, and the WAV file a recording becomes.

A microphone delivers whatever format its driver offers (the recorder asks for 16 kHz mono
16-bit, which most offer; others give 44.1 or 48 kHz, stereo, 32-bit or float). Everything is
brought to 16 kHz mono int16 here with numpy, block by block as it arrives (so stopping
a long recording costs nothing): speech models (whisper) and the audio projectors read
16 kHz, and keeping one format makes a recording's WAV small and its duration exact.
Downsampling first low-passes with a short windowed-sinc filter (speech above 8 kHz would
otherwise fold back as noise), then interpolates linearly; no resampling library is kept in
the app for this one step.
"""

from __future__ import annotations

import io
import math
import wave
from dataclasses import dataclass
from typing import Literal

import numpy as np

RATE = 16000  # what speech models and audio projectors read
SampleKind = Literal["uint8", "int16", "int32", "float32"]
_DTYPES: dict[SampleKind, str] = {
    "uint8": "u1",
    "int16": "<i2",
    "int32": "<i4",
    "float32": "<f4",
}
_TAPS = 63  # the low-pass filter's length: odd, so it is centred on a sample


@dataclass(frozen=True)
class RawFormat:
    """How a device's bytes are laid out: sample rate, channels (interleaved), sample kind."""

    rate: int
    channels: int
    kind: SampleKind

    @property
    def frame_bytes(self) -> int:
        return self.channels * np.dtype(_DTYPES[self.kind]).itemsize

    def is_target(self) -> bool:
        """Already 16 kHz mono int16: the bytes are kept as they come."""
        return (self.rate, self.channels, self.kind) == (RATE, 1, "int16")


@dataclass(frozen=True)
class Level:
    """A block's loudness, each 0..1 of full scale: `rms` (what the meter's bar shows) and
    `peak` (its tick)."""

    rms: float
    peak: float

    @property
    def rms_db(self) -> float:
        """The RMS in dB of full scale (-inf for digital silence)."""
        return 20.0 * math.log10(self.rms) if self.rms > 0 else -math.inf


SILENT = Level(0.0, 0.0)


def to_float(raw: bytes, fmt: RawFormat) -> np.ndarray:
    """Whole frames of `raw` as float32 in [-1, 1], shape (frames, channels)."""
    usable = len(raw) - len(raw) % fmt.frame_bytes
    x = np.frombuffer(raw[:usable], _DTYPES[fmt.kind])
    if fmt.kind == "uint8":
        y = (x.astype(np.float32) - 128.0) / 128.0
    elif fmt.kind == "int16":
        y = x.astype(np.float32) / 32768.0
    elif fmt.kind == "int32":
        y = (x.astype(np.float64) / 2147483648.0).astype(np.float32)
    else:
        y = np.clip(x.astype(np.float32), -1.0, 1.0)
    return y.reshape(-1, fmt.channels)


def _kernel(cutoff: float) -> np.ndarray:
    """A Hann-windowed sinc low-pass at `cutoff` (a fraction of the sample rate, below 0.5),
    `_TAPS` long, summing to 1."""
    n = np.arange(_TAPS, dtype=np.float64) - (_TAPS - 1) / 2
    h = 2 * cutoff * np.sinc(2 * cutoff * n) * np.hanning(_TAPS)
    return np.asarray(h / h.sum(), dtype=np.float64)


class _Resampler:
    """Mono float samples from `src_rate` to `rate`, block by block: the low-pass (when
    downsampling) and the linear interpolation carry their state across blocks, so the
    output is what the whole signal converted at once gives, and a long recording costs
    nothing more when it ends. The signal is taken as zeros before its start and after its
    end (as a centred convolution pads it)."""

    def __init__(self, src_rate: int, rate: int = RATE) -> None:
        self.step = src_rate / rate  # input samples per output sample
        self.h = _kernel(0.45 * rate / src_rate) if rate < src_rate else np.ones(1)
        self.half = (len(self.h) - 1) // 2
        self._pending = np.zeros(self.half)  # input not yet filtered past, from `_p0`
        self._p0 = -self.half
        self._filtered = np.zeros(0)  # filtered input from absolute index `_f0`
        self._f0 = 0
        self._n_in = 0
        self._next = 0  # the next output sample's number

    def push(self, x: np.ndarray) -> np.ndarray:
        self._n_in += len(x)
        return self._run(x, final=False)

    def flush(self) -> np.ndarray:
        return self._run(np.zeros(self.half), final=True)

    def _run(self, x: np.ndarray, final: bool) -> np.ndarray:
        b = np.concatenate([self._pending, x])
        if len(b) >= len(self.h):
            # Output m of a 'valid' convolution is centred on input index _p0 + half + m.
            y = np.convolve(b, self.h, mode="valid")
            self._filtered = np.concatenate([self._filtered, y])
            keep = len(self.h) - 1
            self._p0 += len(b) - keep
            b = b[len(b) - keep :]
        self._pending = b
        last = self._f0 + len(self._filtered) - 1  # the newest filtered index
        if final:
            n_out = max(1, round(self._n_in / self.step)) if self._n_in else 0
            self._filtered = self._filtered[: self._n_in - self._f0]  # not the padding's
            last = self._n_in - 1
        else:  # only outputs between two filtered samples: the next block cannot change them
            n_out = int(np.floor((last - 1) / self.step)) + 1 if last >= 1 else 0
        if n_out <= self._next or len(self._filtered) == 0:
            return np.zeros(0)
        t = np.arange(self._next, n_out, dtype=np.float64) * self.step
        idx = self._f0 + np.arange(len(self._filtered), dtype=np.float64)
        out = np.interp(t, idx, self._filtered)
        self._next = n_out
        drop = max(0, int(np.floor(n_out * self.step)) - self._f0)  # before the next output
        self._filtered = self._filtered[drop:]
        self._f0 += drop
        return np.asarray(out, dtype=np.float64)


def resample(x: np.ndarray, src_rate: int, rate: int = RATE) -> np.ndarray:
    """Mono float samples from `src_rate` to `rate` (float64 out), low-passed first when
    downsampling (speech above the new Nyquist would otherwise fold back as noise)."""
    if src_rate == rate or len(x) == 0:
        return x.astype(np.float64)
    r = _Resampler(src_rate, rate)
    return np.concatenate([r.push(x.astype(np.float64)), r.flush()])


def _int16(y: np.ndarray) -> bytes:
    return np.clip(np.round(y * 32767.0), -32768, 32767).astype("<i2").tobytes()


class Converter:
    """A device's blocks to 16 kHz mono int16 PCM as they come (`add`); `finish` ends it.
    Bytes already in that format are kept as they are."""

    def __init__(self, fmt: RawFormat) -> None:
        self.fmt = fmt
        self._out: list[bytes] = []
        self._rest = b""  # a partial frame, completed by the next block
        self._frames = 0
        self._resampler = None if fmt.is_target() else _Resampler(fmt.rate)

    def add(self, raw: bytes) -> None:
        raw = self._rest + raw
        whole = len(raw) - len(raw) % self.fmt.frame_bytes
        self._rest = raw[whole:]
        self._frames += whole // self.fmt.frame_bytes
        if self._resampler is None:
            self._out.append(raw[:whole])
        elif whole:
            mono = to_float(raw[:whole], self.fmt).mean(axis=1, dtype=np.float64)
            self._out.append(_int16(self._resampler.push(mono)))

    @property
    def seconds(self) -> float:
        """How much sound came so far."""
        return self._frames / self.fmt.rate

    def finish(self) -> bytes:
        if self._resampler is not None:
            self._out.append(_int16(self._resampler.flush()))
        return b"".join(self._out)


def to_pcm16(raw: bytes, fmt: RawFormat) -> bytes:
    """A device's bytes as 16 kHz mono little-endian int16 PCM."""
    c = Converter(fmt)
    c.add(raw)
    return c.finish()


def level(raw: bytes, fmt: RawFormat) -> Level:
    """The loudness of one block of a device's bytes (all channels together)."""
    x = to_float(raw, fmt)
    if x.size == 0:
        return SILENT
    rms = float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))
    return Level(min(rms, 1.0), min(float(np.max(np.abs(x))), 1.0))


def meter_fraction(value: float, floor_db: float = -60.0) -> float:
    """A 0..1 loudness as a meter's fill: dB of full scale from `floor_db` (empty) to 0
    (full), so speech fills it visibly while silence stays near empty."""
    if value <= 0:
        return 0.0
    db = 20.0 * math.log10(value)
    return min(max((db - floor_db) / -floor_db, 0.0), 1.0)


def wav_bytes(pcm16: bytes, rate: int = RATE) -> bytes:
    """Mono 16-bit PCM as a WAV file's bytes (the standard library's writer)."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm16[: len(pcm16) - len(pcm16) % 2])
    return out.getvalue()


def wav_pcm16(wav: bytes) -> bytes:
    """The samples of a WAV file `wav_bytes` wrote, as the 16-bit PCM it holds."""
    with wave.open(io.BytesIO(wav), "rb") as w:
        return w.readframes(w.getnframes())


def pcm16_samples(pcm16: bytes) -> np.ndarray:
    """16-bit PCM as the float32 samples in [-1, 1) a speech model reads."""
    usable = len(pcm16) - len(pcm16) % 2
    return np.frombuffer(pcm16[:usable], "<i2").astype(np.float32) / 32768.0


def format_elapsed(seconds: float) -> str:
    """A recording's length as the composer shows it: 0:07, 1:32."""
    s = max(int(seconds), 0)
    return f"{s // 60}:{s % 60:02d}"


__all__ = [
    "RATE",
    "SILENT",
    "Converter",
    "Level",
    "RawFormat",
    "format_elapsed",
    "level",
    "meter_fraction",
    "pcm16_samples",
    "resample",
    "to_pcm16",
    "wav_bytes",
    "wav_pcm16",
]
