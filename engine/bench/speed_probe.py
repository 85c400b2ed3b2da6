"""Measures the figures `engine.bench.speed_model` predicts with, on this machine, through the
engine itself: small llama models with random weights are written to a temporary folder,
loaded with the same settings a chat uses, and timed while they decode.

* Memory read bandwidth: `engine.bench.hw.measure_read_bandwidth` (numpy sums over a buffer
  larger than the caches; the benchmark's roofline divides by the same figure).
* Fixed work per layer and per token: two models with tiny matrices (their products cost
  next to nothing) and a different number of layers; the difference in step time over the
  difference in layers is the per-layer cost, what is left the per-token cost.
* A kernel's rate (bytes of weights per second) for each weight type and kernel a model uses:
  a two-layer model whose matrices are of that type and large (~96 MiB in all), its step time
  less the fixed work, over its matrix bytes: the rate of a large product (an output
  matrix). A layer's products are measured at their width class ("Q4_1/AMX@576x1536"): as
  many layers of that shape as make about 128 MiB of matrices, so each product is as small
  as the model's own. Both sizes are past what the caches keep between two tokens, as a
  model's weights are: a probe the caches hold runs faster than the model it stands for.
  Measured the first time a model needs it.
* Sampling per vocabulary entry: a tiny model with a large vocabulary (262,144 tokens)
  decodes greedy and at the chat's default sampling, runs alternating; the difference in
  token time over the vocabulary. It goes through the engine's own sampling
  (`Model.submit`), so it is what a chat pays.

Speed does not depend on what the weights say, so the weights are random bytes in the type's
own block layout; the high byte of every 16-bit word is masked so that each block's f16 scale
is a small finite number and no value overflows through the layers. The end-of-sequence
token's row of the output matrix is zero, so its logit is exactly 0 and greedy decoding never
picks it over the random others: every timed step is a full decode.

A step's time is the engine's own decode time (`GenerationStats.eval_ms`, what a chat's tok/s
reports), the fastest of a few short runs: other programs on the machine only ever slow a run.
The fixed work and the kernels decode greedy; the sampling term adds the chat's chain.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

from engine.bench.hw import cpu_name, measure_read_bandwidth
from engine.bench.speed_model import MachineSpeed, kernel_key, split_key
from engine.files import write_text_atomic
from engine.memory import cpu_kernels
from engine.model.gguf import read_gguf
from engine.settings import LoadParams, SamplingParams, default_threads, use_extra_buffers

log = logging.getLogger("candlewick.bench.speed")

MiB = 1 << 20
PROBE_VOCAB = 512
EOS = 2
# The two fixed-work models: layers, and matrices small enough to cost nothing measurable.
FIXED_LAYERS = (2, 26)
TINY_EMBD, TINY_FF = 64, 128
FIXED_TYPE = "F32"
# A kernel's model: two layers whose matrices hold about this many bytes in all, more than
# the caches keep between two tokens, as a model's weights are (a 480 MiB L3 shared with
# other programs on a 2-core Xeon VM kept some tens of MiB).
RATE_BYTES = 96 * MiB
RATE_EMBD = 1024
# A width class's model: layers of that shape holding about this many bytes of matrices,
# within these layer counts. What the caches keep between two tokens still shows at 64 MiB:
# 576-wide Q4_1 layers (SmolLM2's, AMX Xeon) took 77-100 us a layer with 32-63 MiB in all and
# 111-117 us with 95-135 MiB, where SmolLM2 itself (63 MiB of layers and a 29 MiB output
# matrix) runs, so at 64 MiB it was predicted 1.3x too fast.
LAYER_RATE_BYTES = 128 * MiB
LAYER_RATE_LAYERS = (2, 128)
# Raised whenever a change makes the figures kept on a machine wrong (2: the 128 MiB layers).
PROBE_METHOD = 2
# The sampling model: tiny layers and the largest vocabulary in common use (Gemma 3's).
SAMPLING_VOCAB = 262_144
VOCAB_EMBD = 32
VOCAB_TYPE = "Q8_0"
# Types the probe can write (block layouts whose f16 fields sit at even offsets); others are
# left unmeasured and predicted at memory bandwidth.
_SKIP_TYPES = frozenset({"MXFP4", "Q8_K", "Q8_1"})


class ProbeError(RuntimeError):
    """A measurement could not be made; one line for a user."""


# -- the probe models --------------------------------------------------------------------------


def _random_rows(rng: np.random.Generator, rows: int, cols: int, type_name: str) -> np.ndarray:
    """`rows` rows of `cols` values of a ggml type: floats for F32/F16/BF16, else random bytes
    in the type's block layout with every f16 field a small finite number."""
    if type_name in ("F32", "F16"):
        data = rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)
        out: np.ndarray = data.astype(np.float32 if type_name == "F32" else np.float16)
        return out
    qt = GGMLQuantizationType[type_name]
    block, size = GGML_QUANT_SIZES[qt]
    if cols % block:
        raise ProbeError(f"a {type_name} row needs a multiple of {block} values, not {cols}")
    if type_name == "BF16":
        f = (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).view(np.uint32)
        bf16: np.ndarray = (f >> 16).astype(np.uint16).view(np.uint8).reshape(rows, cols * 2)
        return bf16
    raw = rng.integers(0, 256, size=(rows, cols // block * size), dtype=np.uint8)
    # Little-endian f16: sign and exponent in the odd byte. 0x1B keeps the sign 0 and the
    # exponent <= 6: every f16 field is below 2**-8, never Inf or NaN.
    raw[:, 1::2] &= 0x1B
    return raw


def write_probe_model(
    path: Path,
    *,
    n_layer: int,
    n_embd: int,
    n_ff: int,
    type_name: str,
    n_vocab: int = PROBE_VOCAB,
    seed: int = 0,
) -> None:
    """A llama model with random weights: every matrix of `type_name`, a byte-level
    tokenizer of `n_vocab` tokens, tied embeddings (the output matrix is the embedding)."""
    rng = np.random.default_rng(seed)
    n_head = max(1, n_embd // 64)
    w = GGUFWriter(str(path), "llama")
    w.add_name("speed probe")
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("llama")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tokens += [f"\u2581t{i}" for i in range(n_vocab - len(tokens))]
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (n_vocab - 259))
    w.add_bos_token_id(1)
    w.add_eos_token_id(EOS)
    w.add_unk_token_id(0)

    def add(name: str, data: np.ndarray) -> None:
        if data.dtype == np.uint8:
            w.add_tensor(name, data, raw_dtype=GGMLQuantizationType[type_name])
        else:
            w.add_tensor(name, data)

    embd = _random_rows(rng, n_vocab, n_embd, type_name)
    embd[EOS] = 0  # its logit is exactly 0: never the greedy pick among random others
    add("token_embd.weight", embd)
    norm = np.ones(n_embd, dtype=np.float32)
    roles = {  # one array per role, shared by the layers: (rows, cols) = (out, in)
        "attn_q": (n_embd, n_embd),
        "attn_k": (n_embd, n_embd),
        "attn_v": (n_embd, n_embd),
        "attn_output": (n_embd, n_embd),
        "ffn_gate": (n_ff, n_embd),
        "ffn_up": (n_ff, n_embd),
        "ffn_down": (n_embd, n_ff),
    }
    arrays = {r: _random_rows(rng, *shape, type_name) for r, shape in roles.items()}
    for il in range(n_layer):
        w.add_tensor(f"blk.{il}.attn_norm.weight", norm)
        w.add_tensor(f"blk.{il}.ffn_norm.weight", norm)
        for role, data in arrays.items():
            add(f"blk.{il}.{role}.weight", data)
    w.add_tensor("output_norm.weight", norm)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _rate_shape(type_name: str, rate_bytes: int = RATE_BYTES) -> tuple[int, int]:
    """(n_embd, n_ff) of a kernel's probe: two layers of about `rate_bytes` of matrices, the
    FFN width a multiple of 256 (every block size divides it)."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    per_value = size / block
    e = RATE_EMBD
    per_layer = rate_bytes / 2 / per_value
    n_ff = max(256, int((per_layer - 4 * e * e) / (3 * e)) // 256 * 256)
    return e, n_ff


def _layer_count(type_name: str, n_embd: int, n_ff: int, layer_bytes: int) -> int:
    """Layers of a width class's probe: about `layer_bytes` of matrices (four square
    attention products and three FFN products a layer)."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    per_layer = (4 * n_embd * n_embd + 3 * n_embd * n_ff) * size / block
    lo, hi = LAYER_RATE_LAYERS
    return max(lo, min(hi, round(layer_bytes / per_layer)))


# -- timing ------------------------------------------------------------------------------------

StepTimer = Callable[[Path, LoadParams], float]


def decode_step_s(
    path: Path, params: LoadParams, *, tokens: int = 24, min_runs: int = 3, max_runs: int = 8
) -> float:
    """Seconds per decode step of one request on the model at `path`, loaded through the
    engine: the fastest greedy run of `tokens` tokens (decode time only). The first steps
    after a load are slow (pages of the mapped file, repacked weights touched the first
    time), so runs go on until two in a row agree within 10% (at most `max_runs`)."""
    from engine.host.runtime import Model

    steps: list[float] = []
    with Model(path, params) as m:
        for i in range(max_runs):
            steps += _run(m, i, SamplingParams(temperature=0, max_tokens=tokens))
            if len(steps) >= min_runs and abs(steps[-1] - steps[-2]) <= 0.1 * steps[-2]:
                break
    if not steps:
        raise ProbeError(f"the speed probe {path.name} decoded no tokens")
    return min(steps)


def _run(m: Any, i: int, s: SamplingParams) -> list[float]:
    """One reply's seconds per decoded token ([] when it decoded none)."""
    m.reset_cache()
    g = m.submit([1, 300 + i, 301, 302], s)
    g.consume()
    st = g.stats
    return [st.eval_ms / 1000 / st.n_eval] if st.n_eval > 0 and st.eval_ms > 0 else []


SampleTimer = Callable[[Path, LoadParams], tuple[float, float]]


def sampling_steps_s(
    path: Path, params: LoadParams, *, tokens: int = 24, runs: int = 6
) -> tuple[float, float]:
    """(greedy, chat) seconds per token of the model at `path`: replies without penalties at
    temperature 0 (an argmax) and at the chat's default sampling (`SamplingParams()`), runs
    alternating on one loaded model so that other programs slow both alike; the fastest
    of each."""
    from engine.host.runtime import Model

    greedy: list[float] = []
    chat: list[float] = []
    plain = SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=tokens)
    with Model(path, params) as m:
        _run(m, 0, plain)  # the first steps after a load are slow
        for i in range(runs):
            greedy += _run(m, i, plain)
            chat += _run(m, i, SamplingParams(max_tokens=tokens, seed=i))
    if not greedy or not chat:
        raise ProbeError(f"the speed probe {path.name} decoded no tokens")
    return min(greedy), min(chat)


# -- the measurements --------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeSettings:
    """What the probe loads with: the chat's default settings, one sequence."""

    params: LoadParams
    threads: int
    extra_buffers: bool
    sampling_vocab: int = SAMPLING_VOCAB  # the sampling model's vocabulary
    rate_bytes: int = RATE_BYTES  # a large-matrix probe's matrices
    layer_rate_bytes: int = LAYER_RATE_BYTES  # a width class's probe's matrices

    @classmethod
    def default(cls, params: LoadParams | None = None) -> ProbeSettings:
        p = params or LoadParams()
        p = LoadParams(
            n_ctx=1024,
            n_gpu_layers=0,  # the CPU's figures: a GPU's offload is not modelled
            n_threads=p.n_threads,
            flash_attn=p.flash_attn,
            extra_buffers=p.extra_buffers,
            adapt_threads=p.adapt_threads,  # as the chat: fewer threads while cores are busy
            state_cache_mb=0,
        )
        return cls(p, p.n_threads or default_threads(), use_extra_buffers(p.extra_buffers))


def measure_fixed(
    folder: Path,
    settings: ProbeSettings,
    timer: StepTimer = decode_step_s,
    type_name: str = FIXED_TYPE,
) -> tuple[float, float]:
    """(per-layer seconds, per-token seconds) from two tiny models."""
    times = []
    for n in FIXED_LAYERS:
        path = folder / f"fixed-{n}.gguf"
        write_probe_model(path, n_layer=n, n_embd=TINY_EMBD, n_ff=TINY_FF, type_name=type_name)
        times.append(timer(path, settings.params))
        path.unlink()
    (l0, l1), (t0, t1) = FIXED_LAYERS, times
    per_layer = max(0.0, (t1 - t0) / (l1 - l0))
    return per_layer, max(0.0, t0 - l0 * per_layer)


def measure_sampling(
    folder: Path, settings: ProbeSettings, timer: SampleTimer = sampling_steps_s
) -> float:
    """Seconds per vocabulary entry that sampling a token at the chat's defaults costs: a
    model with a large vocabulary (and tiny layers) decoded greedy and at the chat's default
    sampling; the difference over its vocabulary. The greedy pick is an argmax, a few
    microseconds even over Gemma 3's vocabulary, left in the step."""
    n_vocab = settings.sampling_vocab
    path = folder / f"vocab-{n_vocab}.gguf"
    write_probe_model(
        path, n_layer=2, n_embd=VOCAB_EMBD, n_ff=TINY_FF, type_name=VOCAB_TYPE, n_vocab=n_vocab
    )
    try:
        greedy, chat = timer(path, settings.params)
    finally:
        path.unlink(missing_ok=True)
    return max(0.0, chat - greedy) / n_vocab


def measure_rate(
    folder: Path,
    key: str,
    settings: ProbeSettings,
    fixed: tuple[float, float],
    timer: StepTimer = decode_step_s,
) -> float | None:
    """Weight bytes per second through the kernel `key` ("Q4_K/AMX", or at a width class
    "Q4_1/AMX@576x1536"), or None when the probe
    cannot make that kernel run here."""
    try:
        type_name, buffer, width = split_key(key)
    except ValueError:
        return None
    if type_name in _SKIP_TYPES or type_name not in GGMLQuantizationType.__members__:
        return None
    want_extra = buffer != "generic"
    if want_extra and not settings.extra_buffers:
        return None
    if width is None:
        n_layer, (e, n_ff) = 2, _rate_shape(type_name, settings.rate_bytes)
    else:
        (e, n_ff), n_layer = width, _layer_count(type_name, *width, settings.layer_rate_bytes)
    path = folder / f"rate-{type_name}-{e}x{n_ff}.gguf"
    write_probe_model(path, n_layer=n_layer, n_embd=e, n_ff=n_ff, type_name=type_name)
    try:
        gf = read_gguf(path)
        feats = cpu_kernels.detect()
        layer_keys = {
            kernel_key(
                t.type_name,
                cpu_kernels.extra_buffer(t, feats) if want_extra else None,
                width,
            )
            for t in gf.tensors
            if t.name.startswith("blk.") and cpu_kernels.matmul_weight(t)
        }
        if layer_keys != {key}:
            return None  # this build puts these matrices in another kernel's buffer
        matrix_bytes = sum(
            t.n_bytes for t in gf.tensors if cpu_kernels.matmul_weight(t, tied_output=True)
        )
        step = timer(path, LoadParams(**{**_fields(settings.params), "extra_buffers": want_extra}))
    finally:
        path.unlink(missing_ok=True)
    per_layer, per_token = fixed
    work = step - n_layer * per_layer - per_token
    if work <= 0:
        return None
    return matrix_bytes / work


def _fields(p: LoadParams) -> dict[str, Any]:
    return {f: getattr(p, f) for f in p.__dataclass_fields__}


# -- the cache ---------------------------------------------------------------------------------


def load_per_core() -> float:
    """The 1-minute load average per logical CPU (0 where the OS does not tell)."""
    if not hasattr(os, "getloadavg"):
        return 0.0
    return float(os.getloadavg()[0]) / max(1, os.cpu_count() or 1)


def machine_id(settings: ProbeSettings) -> str:
    """What the figures hold for: the CPU, the thread count, the llama.cpp build, and how the
    probe measures (`PROBE_METHOD`: figures kept by an earlier method are measured again)."""
    from engine.native import llama_lib

    build = hashlib.sha256(llama_lib.system_info().encode()).hexdigest()[:12]
    return f"{cpu_name()} | {settings.threads} threads | build {build} | probe {PROBE_METHOD}"


class SpeedProfile:
    """This machine's `MachineSpeed`, measured once and kept in a JSON file (per CPU, thread
    count and llama.cpp build); kernel rates are measured as models need them.

    Thread-safe enough for its use: one caller at a time measures (the app runs it on one
    background thread); the file is replaced atomically."""

    def __init__(
        self,
        path: Path,
        settings: ProbeSettings | None = None,
        *,
        timer: StepTimer = decode_step_s,
        bandwidth: Callable[[], float] | None = None,
        load: Callable[[], float] | None = None,
        chat_timer: SampleTimer = sampling_steps_s,
    ) -> None:
        """`timer`, `chat_timer` ((greedy, chat-default) steps of one model), `bandwidth`,
        `load` (other programs' load per core): the measurements, replaced in tests by a
        simulated machine."""
        self.path = path
        self.settings = settings or ProbeSettings.default()
        self._timer = timer
        self._chat_timer = chat_timer
        self._bandwidth = bandwidth or (lambda: measure_read_bandwidth(256 * MiB, repeats=3))
        self._key = machine_id(self.settings)
        self._load = load or load_per_core

    def cached(self) -> MachineSpeed | None:
        entry = self._read().get(self._key)
        try:
            return MachineSpeed.from_dict(entry) if isinstance(entry, dict) else None
        except (KeyError, TypeError, ValueError):
            return None

    def known(self, keys: Iterable[str] = ()) -> MachineSpeed | None:
        """The cached figures when they cover every kernel in `keys` (never measures)."""
        m = self.cached()
        return m if m is not None and set(keys) <= set(m.rates) else None

    def machine(self, keys: Iterable[str] = ()) -> MachineSpeed:
        """The figures, measuring what is not cached yet: the fixed work, bandwidth and
        sampling once, then each kernel rate in `keys` not measured before (a kernel the
        probe cannot run is remembered as unmeasurable: 0)."""
        m = self.cached()
        load = self._load()
        if m is not None and m.measured_busy and load < m.load_per_core / 2:
            m = None  # measured while the machine was busy, and it is much quieter now
        with tempfile.TemporaryDirectory(prefix="candlewick-speed-") as tmp:
            folder = Path(tmp)
            if m is None:
                t0 = time.perf_counter()
                bw = self._bandwidth()
                per_layer, per_token = measure_fixed(folder, self.settings, self._timer)
                m = MachineSpeed(
                    cpu_name(), self.settings.threads, bw, per_layer, per_token, {}, load
                )
                log.info("speed probe: machine measured in %.2f s", time.perf_counter() - t0)
                self._save(m)
            if m.per_vocab_s is None:
                per_vocab = measure_sampling(folder, self.settings, self._chat_timer)
                m = replace(m, per_vocab_s=per_vocab)
                self._save(m)
            m = self._rates(folder, m, keys)
        return m

    def _rates(self, folder: Path, m: MachineSpeed, keys: Iterable[str]) -> MachineSpeed:
        """`m` with every kernel rate in `keys` measured (0: the probe cannot run it)."""
        missing = sorted(set(keys) - set(m.rates))
        if not missing:
            return m
        fixed = (m.per_layer_s, m.per_token_s)
        found = {}
        for key in missing:
            try:
                rate = measure_rate(folder, key, self.settings, fixed, self._timer)
            except OSError:
                raise  # a full disk, no temporary folder: try again another time
            except Exception as e:  # llama.cpp refused the probe: not measurable here
                log.warning("speed probe: %s not measured: %s", key, e)
                rate = None
            found[key] = rate or 0.0
        m = m.with_rates(found)
        self._save(m)
        return m

    def forget(self) -> None:
        """Drop this machine's figures: the next `machine()` measures again."""
        data = self._read()
        if data.pop(self._key, None) is not None:
            self._write(data)

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _save(self, m: MachineSpeed) -> None:
        data = self._read()
        data[self._key] = m.to_dict()
        self._write(data)

    def _write(self, data: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.path, json.dumps(data, indent=1, sort_keys=True))


__all__ = [
    "ProbeError",
    "ProbeSettings",
    "SpeedProfile",
    "decode_step_s",
    "machine_id",
    "measure_fixed",
    "measure_rate",
    "measure_sampling",
    "sampling_steps_s",
    "write_probe_model",
]
