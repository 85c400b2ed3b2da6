"""Speech test assets: WAV files of known sentences and a tiny whisper-format model.

Speech: espeak-ng (a Debian package) speaks each sentence of `SENTENCES` offline; the WAV it
writes (22.05 kHz) is converted here to 16 kHz mono 16-bit PCM, the rate whisper.cpp reads, so
Candlewick and whisper.cpp's own command line decode the very same samples (neither resamples).

Model (`write_whisper_model`): whisper.cpp's legacy ggml binary layout, as its
models/convert-pt-to-ggml.py writes it: the magic 0x67676d6c, eleven int32 hyper-parameters
(n_vocab, n_audio_ctx, n_audio_state, n_audio_head, n_audio_layer, n_text_ctx, n_text_state,
n_text_head, n_text_layer, n_mels, ftype), the mel filters (int32 n_mel, int32 n_fft, float32
rows), the vocabulary (int32 count, then a uint32 length and the bytes of each token) and the
tensors (int32 n_dims, name length and type, int32 dims innermost first, the name, the data).
This is not GGUF: the `gguf` package cannot write it, so the layout is written with `struct`
and numpy. The dimensions are tiny (`HParams`); every weight is noise (f16 matrices, f32
vectors) from numpy.random.default_rng(SEED), layer norms are 1 and 0, so the transcript is
meaningless but deterministic, the same in pywhispercpp and whisper-cli for the same file.
The vocabulary has whisper's multilingual size (51865: the special tokens sit at fixed ids
from 50256), its 50256 text tokens ASCII (characters, then invented syllables), so any
transcript is text.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import tempfile
import wave
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

SEED = 20261205
SAMPLE_RATE = 16000
GGML_MAGIC = 0x67676D6C
N_VOCAB = 51865  # whisper's multilingual vocabulary: 99 languages, translate, timestamps
N_TEXT_TOKENS = 50256  # ids below are text; <|endoftext|> is 50256, then whisper's specials

# name -> sentence, spoken by espeak-ng into NAME.wav
SENTENCES = {
    "weather": "What is the weather like in Paris today?",
    "lighthouse": "The lighthouse keeper found a message in a bottle.",
}

Array = npt.NDArray[np.float32]


@dataclass(frozen=True)
class HParams:
    n_audio_ctx: int = 1500  # 30 s windows of 3000 mel frames, halved by the second conv
    n_audio_state: int = 64
    n_audio_head: int = 2
    n_audio_layer: int = 2
    n_text_ctx: int = 64  # at most 28 tokens a window: a short, fast greedy decode
    n_text_state: int = 64
    n_text_head: int = 2
    n_text_layer: int = 1  # not 2: whisper.cpp takes a 2-layer decoder for distil-whisper
    n_mels: int = 80


@dataclass(frozen=True)
class SpeechAssets:
    """What `write_all` made in one folder."""

    stt_model: Path
    wavs: dict[str, Path]  # SENTENCES' names -> 16 kHz mono WAV


def write_all(folder: Path) -> SpeechAssets:
    folder.mkdir(parents=True, exist_ok=True)
    model = write_whisper_model(folder / "stt.bin")
    wavs = {name: speak(text, folder / f"{name}.wav") for name, text in SENTENCES.items()}
    return SpeechAssets(model, wavs)


def speak(text: str, out: Path) -> Path:
    """`text` spoken by espeak-ng, written to `out` as 16 kHz mono 16-bit PCM."""
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        raise RuntimeError("espeak-ng is not installed (Debian: apt-get install espeak-ng)")
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "espeak.wav"
        subprocess.run([espeak, "-v", "en-us", "-w", str(raw), text], check=True)
        with wave.open(str(raw), "rb") as w:
            rate, channels = w.getframerate(), w.getnchannels()
            pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float64)
    pcm = pcm.reshape(-1, channels).mean(axis=1)
    n_out = round(len(pcm) * SAMPLE_RATE / rate)
    resampled = np.interp(np.arange(n_out) * (rate / SAMPLE_RATE), np.arange(len(pcm)), pcm)
    out.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(out), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(np.clip(np.round(resampled), -32768, 32767).astype("<i2").tobytes())
    return out


def write_whisper_model(out: Path, hp: HParams = HParams(), *, ftype: int = 1) -> Path:
    """The tiny random-weight whisper model in whisper.cpp's ggml layout (ftype 1: f16
    matrices; 0: all f32, a file whisper.cpp loads and then aborts on in its convolution)."""
    rng = np.random.default_rng(SEED)
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    with part.open("wb") as f:
        f.write(struct.pack("<I", GGML_MAGIC))
        f.write(
            struct.pack(
                "<11i",
                N_VOCAB,
                hp.n_audio_ctx,
                hp.n_audio_state,
                hp.n_audio_head,
                hp.n_audio_layer,
                hp.n_text_ctx,
                hp.n_text_state,
                hp.n_text_head,
                hp.n_text_layer,
                hp.n_mels,
                ftype,  # 1: float16 matrices (whisper.cpp's convolutions take only f16)
            )
        )
        filters = mel_filters(hp.n_mels, 201)
        f.write(struct.pack("<2i", *filters.shape))
        f.write(filters.astype("<f4").tobytes())
        tokens = vocabulary(rng)
        f.write(struct.pack("<i", len(tokens)))
        for token in tokens:
            f.write(struct.pack("<I", len(token)) + token)
        for name, data in _tensors(hp, rng):
            encoded = name.encode()
            # as the convert script stores ftype 1: vectors, biases and positions in f32
            f32 = ftype == 0 or data.ndim < 2 or name.endswith((".bias", "positional_embedding"))
            f.write(struct.pack("<3i", data.ndim, len(encoded), 0 if f32 else 1))
            f.write(struct.pack(f"<{data.ndim}i", *reversed(data.shape)))
            f.write(encoded)
            f.write(np.ascontiguousarray(data, "<f4" if f32 else "<f2").tobytes())
    part.replace(out)
    return out


def vocabulary(rng: np.random.Generator) -> list[bytes]:
    """50256 text tokens and <|endoftext|>: printable ASCII characters first (whisper.cpp looks
    up " " when it suppresses a blank start), then invented syllables, most after a space."""
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    tokens = [bytes([c]) for c in range(0x20, 0x7F)]
    seen = set(tokens)
    while len(tokens) < N_TEXT_TOKENS:
        n = int(rng.integers(1, 4))
        word = "".join(
            consonants[int(rng.integers(len(consonants)))] + vowels[int(rng.integers(len(vowels)))]
            for _ in range(n)
        )
        token = (" " + word if rng.random() < 0.7 else word).encode()
        if token not in seen:
            seen.add(token)
            tokens.append(token)
    return [*tokens, b"<|endoftext|>"]


def mel_filters(n_mels: int, n_fft_bins: int, rate: int = SAMPLE_RATE) -> Array:
    """Triangular filters evenly spaced on the HTK mel scale, 0 Hz to Nyquist."""

    def mel(hz: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return 2595.0 * np.log10(1.0 + hz / 700.0)

    def hz(m: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)

    freqs = np.linspace(0, rate / 2, n_fft_bins)
    edges = hz(np.linspace(0.0, float(mel(np.array(rate / 2.0))), n_mels + 2))
    lower = (freqs[None, :] - edges[:-2, None]) / (edges[1:-1, None] - edges[:-2, None])
    upper = (edges[2:, None] - freqs[None, :]) / (edges[2:, None] - edges[1:-1, None])
    return np.maximum(0.0, np.minimum(lower, upper)).astype(np.float32)


class _Weights:
    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def noise(self, *shape: int, scale: float = 0.2) -> Array:
        return (self.rng.standard_normal(shape) * scale).astype(np.float32)

    def matrix(self, n_out: int, n_in: int) -> Array:
        return self.noise(n_out, n_in, scale=1.0 / np.sqrt(n_in))


def _tensors(hp: HParams, rng: np.random.Generator) -> Iterator[tuple[str, Array]]:
    """Every tensor whisper.cpp's loader creates, in numpy's (outermost first) shape."""
    w = _Weights(rng)
    a, t = hp.n_audio_state, hp.n_text_state
    yield "encoder.positional_embedding", w.noise(hp.n_audio_ctx, a)
    yield "encoder.conv1.weight", w.noise(a, hp.n_mels, 3)
    yield "encoder.conv1.bias", w.noise(a, 1)
    yield "encoder.conv2.weight", w.noise(a, a, 3)
    yield "encoder.conv2.bias", w.noise(a, 1)
    yield from _norm("encoder.ln_post", a)
    for i in range(hp.n_audio_layer):
        yield from _attention(f"encoder.blocks.{i}", "attn", a, w)
        yield from _mlp(f"encoder.blocks.{i}", a, w)
    yield "decoder.positional_embedding", w.noise(hp.n_text_ctx, t)
    yield "decoder.token_embedding.weight", w.noise(N_VOCAB, t)
    yield from _norm("decoder.ln", t)
    for i in range(hp.n_text_layer):
        yield from _attention(f"decoder.blocks.{i}", "attn", t, w)
        yield from _attention(f"decoder.blocks.{i}", "cross_attn", t, w)
        yield from _mlp(f"decoder.blocks.{i}", t, w)


def _norm(prefix: str, n: int) -> Iterator[tuple[str, Array]]:
    yield f"{prefix}.weight", np.ones(n, np.float32)
    yield f"{prefix}.bias", np.zeros(n, np.float32)


def _attention(prefix: str, kind: str, n: int, w: _Weights) -> Iterator[tuple[str, Array]]:
    yield from _norm(f"{prefix}.{kind}_ln", n)
    for part in ("query", "key", "value", "out"):
        yield f"{prefix}.{kind}.{part}.weight", w.matrix(n, n)
        if part != "key":  # whisper's key projections have no bias
            yield f"{prefix}.{kind}.{part}.bias", w.noise(n)


def _mlp(prefix: str, n: int, w: _Weights) -> Iterator[tuple[str, Array]]:
    yield from _norm(f"{prefix}.mlp_ln", n)
    yield f"{prefix}.mlp.0.weight", w.matrix(4 * n, n)
    yield f"{prefix}.mlp.0.bias", w.noise(4 * n)
    yield f"{prefix}.mlp.2.weight", w.matrix(n, 4 * n)
    yield f"{prefix}.mlp.2.bias", w.noise(n)


def whisper_cli_text(
    cli: Path,
    model: Path,
    wav: Path,
    *,
    language: str | None = None,
    translate: bool = False,
    prompt: str | None = None,
    threads: int = 2,
) -> tuple[str, str]:
    """(transcript, language) by whisper.cpp's own whisper-cli: greedy, no temperature
    fallback, as engine.speech decodes; the segments' texts joined and stripped."""
    import json

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "out"
        cmd = [str(cli), "-m", str(model), "-f", str(wav), "-t", str(threads)]
        cmd += ["-l", language or "auto", "-nf", "-bs", "1", "-bo", "1", "-np", "-oj"]
        cmd += ["-of", str(base)]
        if translate:
            cmd.append("-tr")
        if prompt:
            cmd += ["--prompt", prompt]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
        out = json.loads(base.with_suffix(".json").read_text(encoding="utf-8"))
    text = "".join(seg["text"] for seg in out["transcription"]).strip()
    return text, out["result"]["language"]
