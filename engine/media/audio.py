"""Audio a client sent, decoded into the mono float32 samples libmtmd takes.

WAV (PCM, 8 to 32 bits a sample, any number of channels, any rate) is read with the
standard library's `wave`; channels are averaged and the rate converted by linear
interpolation (numpy). No resampling library is kept in the app, and a speech encoder's
log-mel front end does not need more than that. Other formats are refused in one line.
"""

from __future__ import annotations

import io
import wave

import numpy as np

from engine.media.images import MediaError
from engine.native.projector import Samples

MAX_SECONDS = 600  # ten minutes: more than any audio projector reads in one context


def decode_wav(data: bytes, rate: int, name: str = "the audio") -> Samples:
    """`data` (a WAV file) as mono float32 samples at `rate` Hz."""
    if not data:
        raise MediaError(f"{name} is empty")
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise MediaError(f"{name} is not a WAV file (send 16-bit PCM WAV audio)")
    try:
        with wave.open(io.BytesIO(data), "rb") as w:
            channels, width, src_rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
            n_frames = w.getnframes()
            if src_rate < 1000 or channels < 1:
                raise MediaError(f"{name} has a sample rate of {src_rate} Hz")
            if n_frames > MAX_SECONDS * src_rate:
                raise MediaError(
                    f"{name} is {n_frames // src_rate} s long; the most Candlewick reads "
                    f"is {MAX_SECONDS} s"
                )
            raw = w.readframes(n_frames)
    except MediaError:
        raise
    except (wave.Error, EOFError, ValueError) as e:
        raise MediaError(f"{name} is not PCM WAV audio Candlewick can read ({e})") from None
    usable = len(raw) - len(raw) % (width * channels)
    if usable == 0:
        raise MediaError(f"{name} holds no samples")
    x = _to_float(raw[:usable], width).reshape(-1, channels).mean(axis=1)
    if src_rate != rate:
        n_out = max(1, round(len(x) * rate / src_rate))
        t = np.arange(n_out, dtype=np.float64) * (src_rate / rate)
        x = np.interp(t, np.arange(len(x), dtype=np.float64), x)
    return Samples(np.ascontiguousarray(x, dtype=np.float32).tobytes(), rate)


def _to_float(raw: bytes, width: int) -> np.ndarray:
    if width == 1:  # unsigned 8-bit
        return (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    if width == 2:
        return np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0
    if width == 3:
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        v = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        v = np.where(v >= 1 << 23, v - (1 << 24), v)
        return v.astype(np.float32) / float(1 << 23)
    if width == 4:
        return np.frombuffer(raw, "<i4").astype(np.float32) / float(1 << 31)
    raise MediaError(f"WAV samples of {width * 8} bits are not supported")


__all__ = ["MAX_SECONDS", "decode_wav"]
