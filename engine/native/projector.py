"""A model's multimodal projector (an mmproj GGUF) through llama.cpp's libmtmd.

libmtmd turns a prompt with media markers and decoded images or audio into chunks: runs of
text tokens and media chunks, each media chunk a number of embedding rows the text model
reads in place of tokens. This module only tokenizes and *encodes* (the projector's own
graph, on its own ggml context); the embeddings it returns are decoded by the model's one
decode loop through the typed backend (engine.native.backend), never by libmtmd's helpers,
which would decode on their own.

One `Projector` belongs to one loaded model. `tokenize` may run on any thread (llama-server
tokenizes on its HTTP threads too: it reads the projector's settings only); `encode` runs on
the decode loop's thread, one at a time (a lock guards the encoder's output buffer).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from engine.errors import EngineError
from engine.native import llama_lib
from engine.native.load_probe import projector_sizes

MediaKind = Literal["image", "audio"]

_CHUNK_TEXT = 0
_CHUNK_IMAGE = 1
_CHUNK_AUDIO = 2

_mtmd: Any = None
_mtmd_lock = threading.Lock()


def mtmd() -> Any:
    """libmtmd's bindings, loaded on first use (a text-only process never maps the
    library), with its log routed where llama.cpp's goes."""
    global _mtmd
    with _mtmd_lock:
        if _mtmd is None:
            llama_lib.lib()
            import llama_cpp.mtmd_cpp as M

            M.mtmd_log_set(llama_lib.log_callback(), ctypes.c_void_p(0))
            _mtmd = M
    return _mtmd


def marker() -> str:
    """The text that stands for one image or audio clip in a prompt."""
    return bytes(mtmd().mtmd_default_marker()).decode()


@dataclass(frozen=True)
class Pixels:
    """A decoded image: RGB, 8 bits a channel, rows top to bottom."""

    width: int
    height: int
    rgb: bytes

    @property
    def key(self) -> str:
        """Names the picture itself (not its file): the same pixels, the same key."""
        h = hashlib.sha256(f"{self.width}x{self.height}:".encode())
        h.update(self.rgb)
        return "img-" + h.hexdigest()[:32]


@dataclass(frozen=True)
class Samples:
    """Decoded audio: mono float32 PCM at the projector's sample rate."""

    pcm: bytes  # float32, native byte order
    rate: int

    @property
    def n(self) -> int:
        return len(self.pcm) // 4

    @property
    def key(self) -> str:
        h = hashlib.sha256(f"{self.rate}:".encode())
        h.update(self.pcm)
        return "aud-" + h.hexdigest()[:32]


Media = Pixels | Samples


@dataclass
class TextChunk:
    tokens: list[int]


@dataclass
class MediaChunk:
    """One media chunk of a tokenized prompt: `n_tokens` embedding rows (at `n_pos`
    positions), `key` the media's content key. Its handle lives as long as its `Chunks`."""

    kind: MediaKind
    n_tokens: int
    n_pos: int
    key: str
    non_causal: bool
    handle: int  # a const mtmd_input_chunk* inside its Chunks


class Chunks:
    """A tokenized prompt (`parts`: text and media chunks in order), owning libmtmd's
    chunk list; `close` frees it (idempotent; also when collected)."""

    def __init__(self, raw: Any, parts: list[TextChunk | MediaChunk]) -> None:
        self._raw = raw
        self.parts = parts

    def close(self) -> None:
        raw, self._raw = self._raw, None
        if raw:
            mtmd().mtmd_input_chunks_free(raw)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown
            self.close()


class Projector:
    """An mmproj file loaded for one text model (`model_ptr`, a llama_model*)."""

    def __init__(self, path: str | Path, model_ptr: Any, n_embd: int, *, n_threads: int) -> None:
        self.path = Path(path)
        M = mtmd()
        params = M.mtmd_context_params_default()
        params.use_gpu = False
        params.print_timings = False
        params.n_threads = n_threads
        params.warmup = True  # reserves the compute buffer now, as llama-server does
        with llama_lib.capture_log() as lines:
            ctx = M.mtmd_init_from_file(str(self.path).encode(), model_ptr, params)
        if not ctx:
            raise EngineError(
                f"{self.path.name} is not a projector for this model: {llama_lib.last_error(lines)}"
            )
        self._ctx: Any = ctx
        # What libmtmd allocated (weights, the warm-up's compute buffer), from its log.
        self.sizes = projector_sizes(lines)
        self._lock = threading.Lock()
        self.n_embd = n_embd
        self.vision = bool(M.mtmd_support_vision(ctx))
        self.audio = bool(M.mtmd_support_audio(ctx))
        self.audio_rate = int(M.mtmd_get_audio_sample_rate(ctx)) if self.audio else 0
        self.mrope = bool(M.mtmd_decode_use_mrope(ctx))
        self.encodes = 0  # media chunks encoded, for the counters and the tests
        self.encode_ms = 0.0
        if self.mrope:
            self.close()
            raise EngineError(
                f"{self.path.name} places its media by M-RoPE (Qwen2-VL and its kin), "
                "which Candlewick does not support yet"
            )

    def close(self) -> None:
        with self._lock:
            ctx, self._ctx = self._ctx, None
            if ctx:
                mtmd().mtmd_free(ctx)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def _live(self) -> Any:
        if not self._ctx:
            raise EngineError(f"{self.path.name} has been unloaded")
        return self._ctx

    def tokenize(self, text: str, media: Sequence[Media], *, add_special: bool) -> Chunks:
        """Split `text`, with one marker (`marker()`) per item of `media` in order, into
        chunks. The text's special tokens are parsed as such."""
        M = mtmd()
        ctx = self._live()
        for m in media:
            if isinstance(m, Pixels) and not self.vision:
                raise EngineError(f"{self.path.name} reads audio, not images")
            if isinstance(m, Samples) and not self.audio:
                raise EngineError(f"{self.path.name} reads images, not audio")
        bitmaps = [_bitmap(M, m) for m in media]
        try:
            arr = (M.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            data = text.encode("utf-8")
            inp = M.mtmd_input_text(data, len(data), add_special, True)
            raw = M.mtmd_input_chunks_init()
            with llama_lib.capture_log() as lines:
                rc = M.mtmd_tokenize(ctx, raw, ctypes.byref(inp), arr, len(bitmaps))
            if rc != 0:
                M.mtmd_input_chunks_free(raw)
                why = (
                    "the prompt's media markers do not match its attachments"
                    if rc == 1
                    else "the projector could not prepare the media "
                    f"({llama_lib.last_error(lines)})"
                )
                raise EngineError(why)
        finally:
            for b in bitmaps:
                M.mtmd_bitmap_free(b)
        return Chunks(raw, self._parts(M, ctx, raw))

    def _parts(self, M: Any, ctx: Any, raw: Any) -> list[TextChunk | MediaChunk]:
        parts: list[TextChunk | MediaChunk] = []
        for i in range(int(M.mtmd_input_chunks_size(raw))):
            chunk = M.mtmd_input_chunks_get(raw, i)
            kind = int(M.mtmd_input_chunk_get_type(chunk))
            if kind == _CHUNK_TEXT:
                n = ctypes.c_size_t(0)
                toks = M.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                parts.append(TextChunk([int(toks[j]) for j in range(n.value)]))
                continue
            key = M.mtmd_input_chunk_get_id(chunk)
            parts.append(
                MediaChunk(
                    kind="image" if kind == _CHUNK_IMAGE else "audio",
                    n_tokens=int(M.mtmd_input_chunk_get_n_tokens(chunk)),
                    n_pos=int(M.mtmd_input_chunk_get_n_pos(chunk)),
                    key=bytes(key).decode() if key else "",
                    non_causal=bool(M.mtmd_decode_use_non_causal(ctx, chunk)),
                    handle=int(chunk),
                )
            )
        return parts

    def encode(self, chunk: MediaChunk) -> npt.NDArray[np.float32]:
        """The chunk's embeddings, n_tokens by n_embd (a copy: the next encode reuses
        libmtmd's buffer). The chunk's `Chunks` must still be open."""
        M = mtmd()
        with self._lock:
            ctx = self._live()
            t0 = time.perf_counter()
            with llama_lib.capture_log() as lines:
                rc = M.mtmd_encode_chunk(ctx, ctypes.c_void_p(chunk.handle))
            if rc != 0:
                raise EngineError(
                    f"the projector could not encode the {chunk.kind}: "
                    f"{llama_lib.last_error(lines)}"
                )
            n = chunk.n_tokens * self.n_embd
            out = M.mtmd_get_output_embd(ctx)
            rows = np.ctypeslib.as_array(out, shape=(n,)).copy().reshape(chunk.n_tokens, -1)
            self.encodes += 1
            self.encode_ms += (time.perf_counter() - t0) * 1000
        return rows


def _bitmap(M: Any, m: Media) -> Any:
    if isinstance(m, Pixels):
        if len(m.rgb) != m.width * m.height * 3 or m.width < 1 or m.height < 1:
            raise EngineError("an image's pixels do not match its size")
        buf = (ctypes.c_uint8 * len(m.rgb)).from_buffer_copy(m.rgb)
        bmp = M.mtmd_bitmap_init(m.width, m.height, buf)
    else:
        floats = (ctypes.c_float * m.n).from_buffer_copy(m.pcm)
        bmp = M.mtmd_bitmap_init_from_audio(m.n, floats)
    if not bmp:
        raise EngineError("the projector could not take the media")
    M.mtmd_bitmap_set_id(bmp, m.key.encode())
    return bmp


__all__ = [
    "Chunks",
    "Media",
    "MediaChunk",
    "MediaKind",
    "Pixels",
    "Projector",
    "Samples",
    "TextChunk",
    "marker",
    "mtmd",
]
