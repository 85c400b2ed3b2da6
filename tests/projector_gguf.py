"""Small multimodal projectors ("mmproj" GGUF files) with seeded random weights, in the real
layouts that llama.cpp's libmtmd loads, and a numpy forward pass of the vision one.

No real projector can be had without the network, so these are built here. The PIPELINE is real
(the GGUF keys and tensor names the converter writes, libmtmd's loader, its preprocessing,
tokenizer and the clip graph on ggml); the WEIGHTS are noise, so the embeddings they give mean
nothing: a text model fed them describes nothing. No test may read meaning into them beyond
agreeing with `Reference`.

Vision (`write_vision_projector`): projector type "idefics3" (SmolVLM's), a SigLIP encoder and
the idefics3 pixel-shuffle connector, laid out as the vendored llama.cpp's converter
(conversion/smolvlm.py) writes a SmolVLM mmproj with `--outtype f16`:

    keys    general.architecture "clip", general.file_type 1 (MOSTLY_F16),
            clip.projector_type "idefics3", clip.has_vision_encoder, clip.use_gelu,
            clip.vision.{image_size 128, patch_size 8, embedding_length 64,
            feed_forward_length 160, block_count 2, attention.head_count 4,
            attention.layer_norm_epsilon 1e-6, projection_dim 576, image_mean/image_std 0.5,
            projector.scale_factor 4, preproc_image_size 128}
    tensors v.patch_embd.weight [64, 3, 8, 8] and .bias, v.position_embd.weight [256, 64]
            (F32: the converter keeps the SigLIP `.embeddings.` in F32);
            v.blk.{0,1}.{ln1,ln2}.{weight,bias}, v.blk.N.attn_{q,k,v,out}.{weight,bias},
            v.blk.N.ffn_{up,down}.{weight,bias}; v.post_ln.{weight,bias};
            mm.model.fc.weight [576, 1024] (no bias). Matrices F16, vectors F32.
    (shapes in PyTorch order, [out, in]; the GGUF stores them reversed, as ggml's ne)

A 128x128 image is 16x16 patches of 8 px; the pixel shuffle (scale 4) folds each 4x4 block of
patches into one 1024-wide row, and the connector maps it to SmolLM2-135M's 576: 16 tokens per
image. libmtmd's idefics3 preprocessing always slices (tools/mtmd/mtmd-image.cpp,
mtmd_image_preprocessor_idefics3): an image is resized to `preproc_image_size` on its longest
edge, cut into image_size tiles, and followed by an overview of the whole; an image exactly
128x128 is neither resized nor cut (a same-size resize is a copy), so one bitmap gives two image
chunks (the one tile, then the overview) of 16 tokens each, both the pixels as given.

Audio (`write_audio_projector`): projector type "ultravox", a Whisper encoder (two conv1d, one
block) and Ultravox's projector (stack 8 frames, RMS norm, SwiGLU, RMS norm, linear to 576),
laid out as conversion/ultravox.py writes one: clip.has_audio_encoder, clip.audio.{num_mel_bins
128, embedding_length 64, feed_forward_length 128, block_count 1, attention.head_count 4,
attention.layer_norm_epsilon 1e-5, projection_dim 576, projector.stack_factor 10};
a.conv1d.{1,2}.{weight,bias}, a.position_embd.weight [1500, 64], a.blk.0.* (attn_k has no bias,
as in Whisper), a.post_ln.*, mm.a.norm_pre.weight, mm.a.mlp.1.weight, mm.a.norm_mid.weight,
mm.a.mlp.2.weight. libmtmd pads audio to 30 s windows of 3000 mel frames: each window is 1500
positions after the stride-2 conv, 150 tokens after stacking 10: 150 tokens per started 30 s of
audio (5 a second; a 1 s clip gives 150 too).

The stack factor is 10, not the 8 of the published Ultravox models, because the vendored
libmtmd cannot encode a stack factor that does not divide 1500: it counts a window's tokens as
3000 / factor / 2 (rounded down: 187 for 8) while its graph pads 1500 positions up to a multiple
of the factor (188 rows for 8), and clip_encode aborts the process on the mismatch ("expected
output 187 tokens, got 188"). `write_audio_projector(out, stack_factor=8)` writes such a file
(tests/test_projector_asset.py shows the abort in a child process).

Weights: numpy.random.default_rng(SEED) with SEED = 20240601 (vision) and SEED + 1 (audio),
normal, matrices scaled by 1/sqrt(fan_in) so activations stay near unit size; norm weights
1 + 0.1 N, biases 0.02 N, position embeddings 0.1 N.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt

SEED = 20240601
N_EMBD_TEXT = 576  # SmolLM2-135M

# vision (idefics3)
IMAGE_SIZE = 128
PATCH_SIZE = 8
SCALE_FACTOR = 4
V_EMBD = 64
V_FF = 160  # not 64: llama.cpp swaps ffn_up/ffn_down of an idefics3 file whose down is n_embd wide
V_HEADS = 4
V_BLOCKS = 2
V_EPS = 1e-6
IMAGE_MEAN = (0.5, 0.5, 0.5)
IMAGE_STD = (0.5, 0.5, 0.5)
N_PATCHES_SIDE = IMAGE_SIZE // PATCH_SIZE
TOKENS_PER_IMAGE = (N_PATCHES_SIDE // SCALE_FACTOR) ** 2
# libmtmd's idefics3 slicing: the one tile of an image_size image, then its overview
IMAGE_CHUNKS_PER_BITMAP = 2

# audio (ultravox)
N_MEL = 128
A_EMBD = 64
A_FF = 128
A_HEADS = 4
A_BLOCKS = 1
A_EPS = 1e-5
STACK_FACTOR = 10  # divides 1500 (see the docstring: 8 aborts)
A_HIDDEN = 128  # the projector's SwiGLU width (mm.a.mlp.1 gives twice this)
SAMPLE_RATE = 16000
FRAMES_PER_WINDOW = 3000  # 30 s of 10 ms mel frames, libmtmd's fixed Whisper window
WINDOW_SECONDS = 30
N_AUDIO_POS = FRAMES_PER_WINDOW // 2
TOKENS_PER_AUDIO_WINDOW = math.ceil(N_AUDIO_POS / STACK_FACTOR)

F16 = gguf.GGMLQuantizationType.F16
F32 = gguf.GGMLQuantizationType.F32

Array = npt.NDArray[np.float32]


class _Weights:
    """Seeded random tensors: each call draws the next ones from one generator."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def matrix(self, n_out: int, *n_in: int) -> Array:
        fan_in = math.prod(n_in)
        m = self.rng.standard_normal((n_out, *n_in)) / math.sqrt(fan_in)
        return m.astype(np.float32)

    def norm(self, n: int) -> Array:
        return (1.0 + 0.1 * self.rng.standard_normal(n)).astype(np.float32)

    def bias(self, *shape: int) -> Array:
        return (0.02 * self.rng.standard_normal(shape)).astype(np.float32)

    def embedding(self, *shape: int) -> Array:
        return (0.1 * self.rng.standard_normal(shape)).astype(np.float32)


def _write(out: Path, build: gguf.GGUFWriter, tensors: Iterator[tuple[str, Array, bool]]) -> Path:
    """Add the tensors (name, values, stored as F16) and write `out` through a part file."""
    for name, values, as_f16 in tensors:
        if as_f16:
            build.add_tensor(name, values.astype(np.float16), raw_dtype=F16)
        else:
            build.add_tensor(name, values.astype(np.float32), raw_dtype=F32)
    build.write_header_to_file()
    build.write_kv_data_to_file()
    build.write_tensors_to_file()
    build.close()
    return out


def _part(out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    return out.with_name(out.name + ".part")


def write_vision_projector(out: Path) -> Path:
    """Write the idefics3 test projector to `out` (appears whole or not at all)."""
    part = _part(out)
    w = gguf.GGUFWriter(part, arch="clip")
    w.add_name("Candlewick idefics3 test projector (random weights)")
    w.add_description(f"seeded random weights (numpy default_rng({SEED})); outputs are meaningless")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_clip_has_vision_encoder(True)
    w.add_clip_projector_type(gguf.VisionProjectorType.IDEFICS3)
    w.add_vision_projection_dim(N_EMBD_TEXT)
    w.add_vision_image_size(IMAGE_SIZE)
    w.add_vision_patch_size(PATCH_SIZE)
    w.add_vision_embedding_length(V_EMBD)
    w.add_vision_feed_forward_length(V_FF)
    w.add_vision_block_count(V_BLOCKS)
    w.add_vision_head_count(V_HEADS)
    w.add_vision_image_mean(list(IMAGE_MEAN))
    w.add_vision_image_std(list(IMAGE_STD))
    w.add_vision_attention_layernorm_eps(V_EPS)
    w.add_vision_projector_scale_factor(SCALE_FACTOR)
    w.add_vision_use_gelu(True)
    w.add_vision_preproc_image_size(IMAGE_SIZE)
    _write(part, w, _vision_tensors())
    os.replace(part, out)
    return out


def _vision_tensors() -> Iterator[tuple[str, Array, bool]]:
    r = _Weights(SEED)
    e, f = V_EMBD, V_FF
    yield "v.patch_embd.weight", r.matrix(e, 3, PATCH_SIZE, PATCH_SIZE), False
    yield "v.patch_embd.bias", r.bias(e), False
    yield "v.position_embd.weight", r.embedding(N_PATCHES_SIDE**2, e), False
    yield from _encoder_blocks(r, "v.blk", V_BLOCKS, e, f, k_bias=True)
    yield "v.post_ln.weight", r.norm(e), False
    yield "v.post_ln.bias", r.bias(e), False
    yield "mm.model.fc.weight", r.matrix(N_EMBD_TEXT, e * SCALE_FACTOR**2), True


def _encoder_blocks(
    r: _Weights, prefix: str, n: int, e: int, f: int, *, k_bias: bool
) -> Iterator[tuple[str, Array, bool]]:
    """`n` pre-norm transformer blocks of width `e` and feed-forward `f` (SigLIP's and
    Whisper's share the layout), drawn from `r` in the file's order."""
    for i in range(n):
        p = f"{prefix}.{i}"
        yield f"{p}.ln1.weight", r.norm(e), False
        yield f"{p}.ln1.bias", r.bias(e), False
        for t in ("attn_q", "attn_k", "attn_v", "attn_out"):
            yield f"{p}.{t}.weight", r.matrix(e, e), True
            if k_bias or t != "attn_k":
                yield f"{p}.{t}.bias", r.bias(e), False
        yield f"{p}.ln2.weight", r.norm(e), False
        yield f"{p}.ln2.bias", r.bias(e), False
        yield f"{p}.ffn_up.weight", r.matrix(f, e), True
        yield f"{p}.ffn_up.bias", r.bias(f), False
        yield f"{p}.ffn_down.weight", r.matrix(e, f), True
        yield f"{p}.ffn_down.bias", r.bias(e), False


def write_audio_projector(out: Path, stack_factor: int = STACK_FACTOR) -> Path:
    """Write the ultravox test projector to `out` (appears whole or not at all); another
    `stack_factor` than the default only to show libmtmd's count mismatch."""
    part = _part(out)
    w = gguf.GGUFWriter(part, arch="clip")
    w.add_name("Candlewick ultravox test projector (random weights)")
    w.add_description(
        f"seeded random weights (numpy default_rng({SEED + 1})); outputs are meaningless"
    )
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_clip_has_audio_encoder(True)
    w.add_clip_projector_type(gguf.VisionProjectorType.ULTRAVOX)
    w.add_audio_projection_dim(N_EMBD_TEXT)
    w.add_audio_embedding_length(A_EMBD)
    w.add_audio_feed_forward_length(A_FF)
    w.add_audio_block_count(A_BLOCKS)
    w.add_audio_head_count(A_HEADS)
    w.add_audio_num_mel_bins(N_MEL)
    w.add_audio_attention_layernorm_eps(A_EPS)
    w.add_audio_stack_factor(stack_factor)
    _write(part, w, _audio_tensors(stack_factor))
    os.replace(part, out)
    return out


def _audio_tensors(stack_factor: int) -> Iterator[tuple[str, Array, bool]]:
    r = _Weights(SEED + 1)
    e, f = A_EMBD, A_FF
    # conv weights F16 (the converter forces them so); their biases [E, 1] as the converter
    # reshapes them, kept F32
    yield "a.conv1d.1.weight", r.matrix(e, N_MEL, 3), True
    yield "a.conv1d.1.bias", r.bias(e, 1), False
    yield "a.conv1d.2.weight", r.matrix(e, e, 3), True
    yield "a.conv1d.2.bias", r.bias(e, 1), False
    yield "a.position_embd.weight", r.embedding(N_AUDIO_POS, e), False
    # Whisper's k_proj has no bias (the graph asserts it).
    yield from _encoder_blocks(r, "a.blk", A_BLOCKS, e, f, k_bias=False)
    yield "a.post_ln.weight", r.norm(e), False
    yield "a.post_ln.bias", r.bias(e), False
    stacked = e * stack_factor
    yield "mm.a.norm_pre.weight", r.norm(stacked), False
    yield "mm.a.mlp.1.weight", r.matrix(2 * A_HIDDEN, stacked), True
    yield "mm.a.norm_mid.weight", r.norm(A_HIDDEN), False
    yield "mm.a.mlp.2.weight", r.matrix(N_EMBD_TEXT, A_HIDDEN), True


def test_image(seed: int = SEED) -> npt.NDArray[np.uint8]:
    """A seeded IMAGE_SIZE x IMAGE_SIZE RGB image (rows, columns, channels), exactly the size
    libmtmd's idefics3 preprocessing passes through unchanged."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)


test_image.__test__ = False  # type: ignore[attr-defined]  # a helper, not a pytest test


def test_tone(seconds: float = 1.0, hz: float = 440.0) -> Array:
    """A sine at 16 kHz, amplitude 0.5: the audio projector's input."""
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    return (0.5 * np.sin(2 * math.pi * hz * t)).astype(np.float32)


test_tone.__test__ = False  # type: ignore[attr-defined]


@dataclass(frozen=True)
class _Block:
    ln1_w: npt.NDArray[np.float64]
    ln1_b: npt.NDArray[np.float64]
    q_w: npt.NDArray[np.float64]
    q_b: npt.NDArray[np.float64]
    k_w: npt.NDArray[np.float64]
    k_b: npt.NDArray[np.float64]
    v_w: npt.NDArray[np.float64]
    v_b: npt.NDArray[np.float64]
    o_w: npt.NDArray[np.float64]
    o_b: npt.NDArray[np.float64]
    ln2_w: npt.NDArray[np.float64]
    ln2_b: npt.NDArray[np.float64]
    up_w: npt.NDArray[np.float64]
    up_b: npt.NDArray[np.float64]
    down_w: npt.NDArray[np.float64]
    down_b: npt.NDArray[np.float64]


class Reference:
    """The idefics3 encoder and connector in float64 numpy, from the weights as `path` stores
    them (F16 ones as their F16 values), following the vendored llama.cpp's graph
    (tools/mtmd/models/siglip.cpp, clip_graph::build_vit and build_patch_merge_permute)."""

    def __init__(self, path: Path) -> None:
        reader = gguf.GGUFReader(path)
        t = {tensor.name: np.asarray(tensor.data, dtype=np.float64) for tensor in reader.tensors}
        # GGUFReader gives each tensor in numpy order (ggml's ne reversed), as it was written
        self.patch_w = t["v.patch_embd.weight"]
        self.patch_b = t["v.patch_embd.bias"]
        self.pos = t["v.position_embd.weight"]
        self.blocks = [
            _Block(
                *(
                    t[f"v.blk.{i}.{name}"]
                    for name in (
                        "ln1.weight",
                        "ln1.bias",
                        "attn_q.weight",
                        "attn_q.bias",
                        "attn_k.weight",
                        "attn_k.bias",
                        "attn_v.weight",
                        "attn_v.bias",
                        "attn_out.weight",
                        "attn_out.bias",
                        "ln2.weight",
                        "ln2.bias",
                        "ffn_up.weight",
                        "ffn_up.bias",
                        "ffn_down.weight",
                        "ffn_down.bias",
                    )
                )
            )
            for i in range(V_BLOCKS)
        ]
        self.post_w = t["v.post_ln.weight"]
        self.post_b = t["v.post_ln.bias"]
        self.fc = t["mm.model.fc.weight"]

    @staticmethod
    def preprocess(image: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
        """libmtmd's normalization of an image it does not resize: u8/255, then (x - mean)/std
        per channel, in float32 as clip_image_f32::normalize does. Returns (3, H, W)."""
        x = image.astype(np.float32) / np.float32(255.0)
        mean = np.asarray(IMAGE_MEAN, dtype=np.float32)
        std = np.asarray(IMAGE_STD, dtype=np.float32)
        return np.ascontiguousarray(((x - mean) / std).transpose(2, 0, 1))

    def embed(self, image: npt.NDArray[np.uint8]) -> npt.NDArray[np.float64]:
        """The (TOKENS_PER_IMAGE, 576) embeddings of an IMAGE_SIZE x IMAGE_SIZE RGB image."""
        assert image.shape == (IMAGE_SIZE, IMAGE_SIZE, 3), image.shape
        x = self.preprocess(image).astype(np.float64)
        n, p = N_PATCHES_SIDE, PATCH_SIZE
        # conv2d with stride = kernel = patch: patch (row y, column x) is token y * n + x
        patches = x.reshape(3, n, p, n, p).transpose(1, 3, 0, 2, 4).reshape(n * n, 3 * p * p)
        h = patches @ self.patch_w.reshape(V_EMBD, -1).T + self.patch_b + self.pos
        for b in self.blocks:
            h = h + self._attention(_layer_norm(h, b.ln1_w, b.ln1_b, V_EPS), b)
            u = _layer_norm(h, b.ln2_w, b.ln2_b, V_EPS) @ b.up_w.T + b.up_b
            h = h + _gelu_tanh(u) @ b.down_w.T + b.down_b
        h = _layer_norm(h, self.post_w, self.post_b, V_EPS)
        return _pixel_shuffle(h, n, SCALE_FACTOR) @ self.fc.T

    @staticmethod
    def _attention(x: npt.NDArray[np.float64], b: _Block) -> npt.NDArray[np.float64]:
        n_tok, d_head = x.shape[0], V_EMBD // V_HEADS

        def heads(
            w: npt.NDArray[np.float64], bias: npt.NDArray[np.float64]
        ) -> npt.NDArray[np.float64]:
            return (x @ w.T + bias).reshape(n_tok, V_HEADS, d_head).transpose(1, 0, 2)

        q, k, v = heads(b.q_w, b.q_b), heads(b.k_w, b.k_b), heads(b.v_w, b.v_b)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(d_head)
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        out = (s @ v).transpose(1, 0, 2).reshape(n_tok, V_EMBD)
        projected: npt.NDArray[np.float64] = out @ b.o_w.T + b.o_b
        return projected


def _layer_norm(
    x: npt.NDArray[np.float64], w: npt.NDArray[np.float64], b: npt.NDArray[np.float64], eps: float
) -> npt.NDArray[np.float64]:
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    normed: npt.NDArray[np.float64] = (x - mu) / np.sqrt(var + eps) * w + b
    return normed


def _gelu_tanh(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """ggml_gelu: the tanh approximation (gelu_pytorch_tanh)."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _pixel_shuffle(h: npt.NDArray[np.float64], side: int, s: int) -> npt.NDArray[np.float64]:
    """clip_graph::build_patch_merge_permute: the patches of each s x s block, row by row, side
    by side in one row (feature index (dy * s + dx) * n_embd + e), blocks in row-major order."""
    e = h.shape[-1]
    grid = h.reshape(side // s, s, side // s, s, e)  # block row, dy, block column, dx, e
    return grid.transpose(0, 2, 1, 3, 4).reshape((side // s) ** 2, s * s * e)
