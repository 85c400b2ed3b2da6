"""Test pictures and clips as the files a user attaches: PNG, JPEG and 16-bit PCM WAV bytes."""

from __future__ import annotations

import io
import wave

import numpy as np
from PIL import Image


def png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return buf.getvalue()


def jpeg(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=85)
    return buf.getvalue()


def wav(samples: np.ndarray, rate: int) -> bytes:
    """Mono 16-bit PCM at `rate` Hz of float samples in [-1, 1]."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return buf.getvalue()
