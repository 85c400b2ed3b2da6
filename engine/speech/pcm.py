"""Synthesised speech as samples, and as the WAV file or raw PCM a client is sent.

The WAV container is written by the stdlib's `wave` module; raw PCM is what OpenAI's
`response_format: "pcm"` sends: 16-bit little-endian mono samples without a header; MP3
(OpenAI's default format) is LAME's, through the `lameenc` wheel.
"""

from __future__ import annotations

import io
import wave
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from engine.errors import EngineError


@dataclass(frozen=True)
class Pcm:
    """Mono 16-bit speech: `samples` (int16) at `rate` samples a second."""

    samples: NDArray[np.int16]
    rate: int

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.rate

    @staticmethod
    def from_float(audio: NDArray[np.float32], rate: int) -> Pcm:
        """Samples in [-1, 1] (a neural voice's output), clipped and scaled to 16 bits."""
        scaled = np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0) * 32767.0
        return Pcm(np.round(scaled).astype(np.int16), rate)


def to_pcm_bytes(pcm: Pcm) -> bytes:
    """The samples as 16-bit little-endian bytes, whatever this machine's byte order."""
    return np.asarray(pcm.samples, dtype="<i2").tobytes()


def to_wav(pcm: Pcm) -> bytes:
    """A mono 16-bit WAV file of `pcm`."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(pcm.rate)
        w.writeframes(to_pcm_bytes(pcm))
    return out.getvalue()


MP3_KBPS = 64  # speech in mono: as clear as the voice itself


def to_mp3(pcm: Pcm) -> bytes:
    """An MP3 of `pcm`, encoded by LAME (the `lameenc` wheel) at the samples' own rate."""
    try:
        import lameenc  # type: ignore[import-untyped, import-not-found, unused-ignore]
    except ImportError as e:
        raise EngineError(f"MP3 needs the lameenc package: {e}") from None
    encoder = lameenc.Encoder()
    encoder.set_channels(1)
    encoder.set_in_sample_rate(pcm.rate)
    encoder.set_bit_rate(MP3_KBPS)
    encoder.set_quality(5)  # LAME's "good", several times faster than its best
    return bytes(encoder.encode(to_pcm_bytes(pcm))) + bytes(encoder.flush())
