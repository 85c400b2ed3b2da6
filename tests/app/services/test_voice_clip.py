"""A microphone's samples as the 16 kHz mono 16-bit WAV a recording becomes, and the level
the composer's meter shows (app/services/voice_clip.py)."""

from __future__ import annotations

import io
import math
import wave

import numpy as np
import pytest

from app.services.voice_clip import (
    RATE,
    Converter,
    RawFormat,
    format_elapsed,
    level,
    meter_fraction,
    pcm16_samples,
    resample,
    to_pcm16,
    wav_bytes,
    wav_pcm16,
)
from engine.media.audio import decode_wav


def tone(freq: float, seconds: float, rate: int, amp: float = 0.5) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def dominant_hz(x: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spectrum) * rate / len(x))


def test_16k_mono_int16_is_kept_byte_for_byte() -> None:
    pcm = (tone(440, 0.25, RATE) * 32767).astype("<i2").tobytes()
    fmt = RawFormat(RATE, 1, "int16")
    assert fmt.is_target() and to_pcm16(pcm, fmt) == pcm
    assert to_pcm16(pcm + b"\x01", fmt) == pcm  # half a sample is dropped


@pytest.mark.parametrize("kind", ["uint8", "int16", "int32", "float32"])
def test_48k_stereo_of_any_sample_kind_becomes_16k_mono_with_its_pitch(kind: str) -> None:
    left = tone(440, 1.0, 48000, 0.4)
    stereo = np.stack([left, left], axis=1).reshape(-1)
    raw = {
        "uint8": lambda x: np.round(x * 127 + 128).astype(np.uint8).tobytes(),
        "int16": lambda x: np.round(x * 32767).astype("<i2").tobytes(),
        "int32": lambda x: np.round(x.astype(np.float64) * 2147483647).astype("<i4").tobytes(),
        "float32": lambda x: x.astype("<f4").tobytes(),
    }[kind](stereo)
    out = pcm16_samples(to_pcm16(raw, RawFormat(48000, 2, kind)))  # type: ignore[arg-type]
    assert len(out) == RATE  # one second
    assert dominant_hz(out, RATE) == pytest.approx(440, abs=2)
    assert float(np.sqrt(np.mean(out[500:-500] ** 2))) == pytest.approx(
        0.4 / math.sqrt(2), rel=0.05
    )


def test_downsampling_filters_what_16k_cannot_hold() -> None:
    # 11 kHz at 48 kHz would fold to 5 kHz at 16 kHz without the low-pass.
    high = tone(11000, 1.0, 48000, 0.5)
    out = resample(high.astype(np.float64), 48000)
    assert float(np.sqrt(np.mean(out[200:-200] ** 2))) < 0.01
    speech_band = resample(tone(1000, 1.0, 48000, 0.5).astype(np.float64), 48000)
    assert float(np.sqrt(np.mean(speech_band[200:-200] ** 2))) > 0.33


def test_a_stream_converted_once_has_no_seams_and_counts_its_seconds() -> None:
    x = tone(300, 0.9, 44100)
    raw = np.round(x * 32767).astype("<i2").tobytes()
    conv = Converter(RawFormat(44100, 1, "int16"))
    for at in range(0, len(raw), 882 * 2 + 6):  # blocks of odd sizes, as a device gives them
        conv.add(raw[at : at + 882 * 2 + 6])
    assert conv.seconds == pytest.approx(0.9, abs=1 / 44100)
    whole = to_pcm16(raw, RawFormat(44100, 1, "int16"))
    assert conv.finish() == whole
    # The same as the whole recording filtered and interpolated in one go (within rounding).
    h = np.arange(63) - 31.0
    cutoff = 0.45 * 16000 / 44100
    h = 2 * cutoff * np.sinc(2 * cutoff * h) * np.hanning(63)
    y = np.convolve(x.astype(np.float64) * 32767 / 32768, h / h.sum(), mode="same")
    n_out = round(len(x) * 16000 / 44100)
    ref = np.interp(np.arange(n_out) * 44100 / 16000, np.arange(len(x)), y) * 32767
    got = np.frombuffer(whole, "<i2").astype(np.float64)
    assert len(got) == n_out and np.max(np.abs(got - ref)) <= 1.0


def test_level_rms_and_peak_and_the_meter_in_decibels() -> None:
    fmt = RawFormat(RATE, 1, "int16")
    assert level(b"", fmt).rms == 0 and level(b"\x00\x00" * 100, fmt).rms_db == -math.inf
    lv = level((tone(1000, 0.1, RATE, 0.5) * 32767).astype("<i2").tobytes(), fmt)
    assert lv.rms == pytest.approx(0.5 / math.sqrt(2), rel=0.01)
    assert lv.peak == pytest.approx(0.5, rel=0.01)
    assert meter_fraction(0.0) == 0.0 and meter_fraction(1.0) == 1.0
    assert meter_fraction(0.001) == pytest.approx(0.0)  # -60 dB: the floor
    assert meter_fraction(0.0316) == pytest.approx(0.5, abs=0.01)  # -30 dB: half way
    assert meter_fraction(2.0) == 1.0


def test_the_wav_is_16k_mono_16bit_and_reads_back_as_the_engine_reads_it() -> None:
    pcm = (tone(500, 0.5, RATE, 0.3) * 32767).astype("<i2").tobytes()
    data = wav_bytes(pcm)
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, RATE)
        assert w.getnframes() == RATE // 2
    assert wav_pcm16(data) == pcm
    samples = np.frombuffer(decode_wav(data, RATE).pcm, np.float32)
    assert np.array_equal(samples, pcm16_samples(pcm))


def test_elapsed_time_as_shown() -> None:
    assert [format_elapsed(s) for s in (0, 0.99, 7.2, 59.9, 92, 3600)] == [
        "0:00",
        "0:00",
        "0:07",
        "0:59",
        "1:32",
        "60:00",
    ]
