"""The CPU kernel rules (engine.memory.cpu_kernels): extra weight copies and batch invariance.

Every rule is checked with forced CPU features, so a machine of one kind (an AMD EPYC with
AVX-512, an Intel Xeon with AMX) also tests the other kinds' branches; the real load on this
machine checks the rules against what llama.cpp logs and computes here.
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from engine.host.runtime import Model
from engine.memory import cpu_kernels
from engine.memory.actual import actual_from_log
from engine.memory.cpu_kernels import CpuFeatures, Exactness, batch_exactness, weights_exactness
from engine.memory.model_spec import ModelSpec
from engine.model.gguf import GGUFFile, TensorInfo, read_gguf
from engine.settings import LoadParams
from tests.exactness import exact_load

# llama_print_system_info() as three kinds of machine print it.
EPYC = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
    "AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | LLAMAFILE = 1 | "
    "OPENMP = 1 | REPACK = 1 |"
)
ZEN2 = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
    "LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |"
)
XEON_AMX = EPYC.replace("LLAMAFILE", "AMX_INT8 = 1 | LLAMAFILE")
ARM = (
    "CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | MATMUL_INT8 = 1 | DOTPROD = 1 | "
    "SVE = 1 | SVE_CNT = 16 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |"
)
ARM_DOT = "CPU : NEON = 1 | ARM_FMA = 1 | DOTPROD = 1 | LLAMAFILE = 1 | REPACK = 1 |"
PLAIN = "CPU : SSE3 = 1 | SSSE3 = 1 | OPENMP = 1 | REPACK = 1 |"  # no AVX: no repack, no sgemm
F = {
    name: CpuFeatures.parse(text)
    for name, text in {
        "epyc": EPYC,
        "zen2": ZEN2,
        "xeon": XEON_AMX,
        "arm": ARM,
        "arm_dot": ARM_DOT,
        "plain": PLAIN,
    }.items()
}
MiB = 1 << 20


def tensor(name: str, type_name: str, k: int = 576, n: int = 1536) -> TensorInfo:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    return TensorInfo(name, (k, n), GGMLQuantizationType[type_name].value, 0, k // block * size * n)


def test_features_parse_what_llama_cpp_prints() -> None:
    e, a = F["epyc"], F["arm"]
    assert e.avx2 and e.avx512 and e.llamafile and e.repack and not e.amx_int8 and not e.neon
    assert F["xeon"].amx_int8 and F["xeon"].avx512_vnni
    assert a.neon and a.matmul_int8 and a.dotprod and a.sve and a.sve_cnt == 16 and not a.avx2
    assert "AVX2" in e.summary and "REPACK" in e.summary and "SVE_CNT" in a.summary
    # This build's own line parses to something that names its SIMD level; AVX512-FP16, which
    # the line does not name, comes from the CPU's flags on an AVX-512 build.
    here = cpu_kernels.detect()
    assert dataclasses.replace(
        here,
        avx512_fp16=False,
        f16_avx512f_steps=False,
        amx_small_batch=False,
        fa_small_tiles=False,
        quant_columns=False,
    ) == (CpuFeatures.parse(cpu_kernels.llama_lib.system_info()))
    assert here.fa_small_tiles == cpu_kernels.llama_lib.flash_attn_small_tiles()
    assert here.quant_columns == cpu_kernels.llama_lib.quant_columns()
    fp16_cpu = here.avx512 and "avx512_fp16" in cpu_kernels._cpu_flags()
    assert here.avx512_fp16 + here.f16_avx512f_steps == fp16_cpu
    assert here.f16_avx512f_steps == (fp16_cpu and cpu_kernels.llama_lib.f16_vectors_avx512f())


@pytest.mark.parametrize("marker", [False, True])
def test_detect_reads_the_builds_f16_step_marker(
    monkeypatch: pytest.MonkeyPatch, marker: bool
) -> None:
    # An AVX512-FP16 CPU: the build's marker says its f16 vectors step in 64, not 128.
    monkeypatch.setattr(cpu_kernels.llama_lib, "system_info", lambda: "CPU : AVX512 = 1 |")
    monkeypatch.setattr(cpu_kernels, "_cpu_flags", lambda: frozenset({"avx512_fp16"}))
    monkeypatch.setattr(cpu_kernels.llama_lib, "f16_vectors_avx512f", lambda: marker)
    f = cpu_kernels.detect.__wrapped__()
    assert (f.avx512_fp16, f.f16_avx512f_steps) == (not marker, marker)
    assert cpu_kernels.f16_vector_step(f) == (64 if marker else 128)
    assert cpu_kernels.flash_attn_scalar(f, [64]) == (not marker)
    # A CPU without AVX512-FP16 steps in 64 either way and has no measured limit.
    monkeypatch.setattr(cpu_kernels, "_cpu_flags", lambda: frozenset())
    f = cpu_kernels.detect.__wrapped__()
    assert not f.avx512_fp16 and not f.f16_avx512f_steps
    assert cpu_kernels.flash_attn_ctx_limit(f, [64]) is None


@pytest.mark.parametrize("marker", [False, True])
def test_detect_reads_the_builds_small_batch_marker(
    monkeypatch: pytest.MonkeyPatch, marker: bool
) -> None:
    # The patched build's AMX code says so; a build without AMX has nothing to say.
    monkeypatch.setattr(cpu_kernels.llama_lib, "amx_small_batches", lambda: marker)
    monkeypatch.setattr(cpu_kernels, "_cpu_flags", lambda: frozenset())
    monkeypatch.setattr(cpu_kernels.llama_lib, "system_info", lambda: "CPU : AMX_INT8 = 1 |")
    f = cpu_kernels.detect.__wrapped__()
    assert f.amx_int8 and f.amx_small_batch == marker
    assert ("AMX_SMALL_BATCH" in f.summary) == marker
    monkeypatch.setattr(cpu_kernels.llama_lib, "system_info", lambda: "CPU : AVX512 = 1 |")
    assert not cpu_kernels.detect.__wrapped__().amx_small_batch


SPR = dataclasses.replace(F["xeon"], avx512_fp16=True)


@pytest.mark.parametrize(
    ("features", "step"),
    [(SPR, 128), (F["epyc"], 64), (F["zen2"], 32), (F["arm_dot"], 16), (F["arm"], None)],
)
def test_f16_vector_step_follows_simd_mappings(features: CpuFeatures, step: int | None) -> None:
    assert cpu_kernels.f16_vector_step(features) == step


def test_flash_attention_goes_element_by_element_for_narrow_heads_under_avx512_fp16() -> None:
    # SmolLM2's heads are 64 wide, Gemma-3's 256: only the first leaves a tail under a step of 128.
    assert cpu_kernels.flash_attn_scalar(SPR, [64, 64])
    assert not cpu_kernels.flash_attn_scalar(SPR, [256, 256])
    assert cpu_kernels.flash_attn_scalar(SPR, [192])  # 128 vectorised, 64 element by element
    assert not cpu_kernels.flash_attn_scalar(F["epyc"], [64, 64])
    assert not cpu_kernels.flash_attn_scalar(F["arm"], [80])  # SVE predicates its tail
    assert not cpu_kernels.flash_attn_scalar(F["plain"], [64])
    assert not cpu_kernels.flash_attn_scalar(SPR, [])  # a quantized cache: no f16 heads


def test_narrow_heads_on_avx512f_steps_have_a_context_limit() -> None:
    # The project's build on an AMX Xeon: 64-wide heads in whole steps, slower past 4,096 cells
    # a sequence.
    spr64 = dataclasses.replace(F["xeon"], f16_avx512f_steps=True)
    limit = cpu_kernels.FLASH_ATTN_NARROW_CROSSOVER
    assert cpu_kernels.flash_attn_ctx_limit(spr64, [64, 64]) == limit == 4096
    assert not cpu_kernels.flash_attn_scalar(spr64, [64, 64])
    assert cpu_kernels.flash_attn_ctx_limit(spr64, [256, 256]) is None  # wide heads: none
    assert cpu_kernels.flash_attn_ctx_limit(spr64, []) is None  # a quantized cache
    assert cpu_kernels.flash_attn_ctx_limit(SPR, [64]) is None  # scalar instead (off at once)
    assert cpu_kernels.flash_attn_ctx_limit(F["epyc"], [64]) is None
    # The project's build decodes small batches through the tiled kernel: no limit there.
    tiles = dataclasses.replace(spr64, fa_small_tiles=True)
    assert cpu_kernels.flash_attn_ctx_limit(tiles, [64, 64]) is None


def test_flash_attention_rule_reads_the_models_heads(
    monkeypatch: pytest.MonkeyPatch, smollm2_path: Path, gemma_path: Path
) -> None:
    smol, gemma = read_gguf(smollm2_path), read_gguf(gemma_path)

    def scalar(gf: GGUFFile, t: str) -> bool:  # as resolve_flash_attn_for reads this build
        return cpu_kernels.flash_attn_scalar(
            cpu_kernels.detect(), cpu_kernels.f16_head_dims(gf, t, t)
        )

    def ctx_limit(gf: GGUFFile, t: str) -> int | None:
        return cpu_kernels.flash_attn_ctx_limit(
            cpu_kernels.detect(), cpu_kernels.f16_head_dims(gf, t, t)
        )

    monkeypatch.setattr(cpu_kernels, "detect", lambda: SPR)
    assert scalar(smol, "f16")
    assert not scalar(smol, "q8_0")
    assert not scalar(gemma, "f16")
    assert ctx_limit(smol, "f16") is None
    monkeypatch.setattr(
        cpu_kernels, "detect", lambda: dataclasses.replace(F["xeon"], f16_avx512f_steps=True)
    )
    assert ctx_limit(smol, "f16") == 4096
    assert ctx_limit(smol, "q8_0") is None
    assert ctx_limit(gemma, "f16") is None
    monkeypatch.setattr(cpu_kernels, "detect", lambda: F["epyc"])
    assert not scalar(smol, "f16")


@pytest.mark.parametrize(
    ("kind", "type_name", "rows", "expected"),
    [
        ("epyc", "Q4_K", 1536, "CPU_REPACK"),  # Gemma-3's Q4_K layers on the EPYC
        ("zen2", "Q4_K", 1536, "CPU_REPACK"),
        ("epyc", "Q4_K", 1532, None),  # rows must come in eights
        ("epyc", "Q4_1", 1536, None),  # SmolLM2: not repacked on x86
        ("epyc", "Q4_0", 1536, "CPU_REPACK"),
        ("epyc", "IQ4_NL", 1536, "CPU_REPACK"),
        ("epyc", "Q2_K", 1536, "CPU_REPACK"),  # AVX-512 only
        ("zen2", "Q2_K", 1536, None),
        ("epyc", "Q6_K", 1536, None),
        ("epyc", "Q8_0", 1536, None),
        ("xeon", "Q4_1", 1536, "AMX"),  # AMX comes first where it takes the type
        ("xeon", "Q4_K", 1536, "AMX"),
        ("xeon", "Q5_0", 1536, None),
        ("xeon", "IQ4_NL", 1536, "CPU_REPACK"),  # not an AMX type: the next buffer takes it
        ("arm", "Q4_0", 1532, "CPU_REPACK"),  # NEON: rows in fours
        ("arm", "Q6_K", 1536, "CPU_REPACK"),
        ("arm", "Q8_0", 1536, "CPU_REPACK"),
        ("arm_dot", "Q5_K", 1536, "CPU_REPACK"),
        ("arm_dot", "Q4_1", 1536, None),
        ("plain", "Q4_0", 1536, None),
    ],
)
def test_extra_buffer_rules(kind: str, type_name: str, rows: int, expected: str | None) -> None:
    t = tensor(
        "blk.0.ffn_up.weight",
        type_name,
        576 if type_name.endswith("_0") or type_name in ("Q4_1", "IQ4_NL") else 768,
        rows,
    )
    assert cpu_kernels.extra_buffer(t, F[kind]) == expected


def test_only_matrix_products_are_copied() -> None:
    f = F["epyc"]
    assert cpu_kernels.extra_buffer(tensor("token_embd.weight", "Q4_K", 768), f) is None
    assert (
        cpu_kernels.extra_buffer(tensor("token_embd.weight", "Q4_K", 768), f, tied_output=True)
        == "CPU_REPACK"
    )
    assert cpu_kernels.extra_buffer(tensor("blk.0.attn_norm.weight", "Q4_K", 768), f) is None
    experts = TensorInfo("blk.0.ffn_up_exps.weight", (768, 1536, 8), "Q4_K", 0, 1)
    assert cpu_kernels.matmul_weight(experts)


def test_copies_counted_for_each_kind_of_cpu(smollm2_path: Path, gemma_path: Path) -> None:
    """The same files planned for three CPUs: AMX copies SmolLM2's layers (95.34 MiB, the size
    llama.cpp logged on an AMX Xeon), the EPYC copies only Gemma-3's Q4_K matrices."""
    smol, gemma = read_gguf(smollm2_path), read_gguf(gemma_path)
    on = {
        k: (ModelSpec.from_gguf(smol, F[k]), ModelSpec.from_gguf(gemma, F[k]))
        for k in ("epyc", "xeon", "arm", "plain")
    }

    def copies(spec: ModelSpec) -> int:
        return sum(spec.copy_layer_bytes) + spec.copy_output_bytes

    assert copies(on["epyc"][0]) == 0 and on["epyc"][0].copy_buffers == ()
    assert on["epyc"][1].copy_buffers == ("CPU_REPACK",)
    assert abs(copies(on["epyc"][1]) - 12.66 * MiB) <= 0.005 * MiB
    assert on["xeon"][0].copy_buffers == ("AMX",)
    assert abs(copies(on["xeon"][0]) - 95.34 * MiB) <= 0.005 * MiB
    assert abs(copies(on["xeon"][1]) - 213.91 * MiB) <= 0.005 * MiB
    assert copies(on["plain"][0]) == copies(on["plain"][1]) == 0
    assert copies(on["arm"][1]) > copies(on["epyc"][1])  # NEON repacks Q6_K and Q8_0 too


def logged_extra(lines: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in lines:
        for buf in ("CPU_REPACK", "AMX"):
            if f"{buf} model buffer size" in line:
                out[buf] = round(float(line.split("=")[1].split()[0]) * MiB)
    return out


@pytest.mark.parametrize("which", ["smollm2", "gemma"])
@pytest.mark.parametrize("extra", [True, False])
@pytest.mark.model
def test_copies_match_what_llama_cpp_allocates_here(
    request: pytest.FixtureRequest, which: str, extra: bool
) -> None:
    """Both sides of the switch on this machine: with extra buffers llama.cpp's logged
    CPU_REPACK / AMX buffers are the predicted copies; without them, none."""
    path = Path(request.getfixturevalue(f"{which}_path"))
    spec = ModelSpec.from_gguf(read_gguf(path))
    with Model(
        path,
        LoadParams(n_ctx=256, n_gpu_layers=0, n_threads=1, extra_buffers=extra, state_cache_mb=0),
    ) as m:
        logged = logged_extra(m.load_info.log)
        actual = actual_from_log(m.load_info.log)
    predicted = sum(spec.copy_layer_bytes) + spec.copy_output_bytes
    if not extra:
        assert logged == {}
        return
    assert set(logged) == set(spec.copy_buffers)
    assert abs(sum(logged.values()) - predicted) <= 0.005 * MiB * max(len(logged), 1)
    assert actual.weights_bytes >= predicted


# -- batch invariance ------------------------------------------------------------------------


def test_exactness_rules_on_each_kind_of_cpu(smollm2_path: Path, exact_smollm2_path: Path) -> None:
    smol = read_gguf(smollm2_path).tensors
    twin = read_gguf(exact_smollm2_path).tensors

    def exact(tensors: list[TensorInfo], kind: str, **kw: object) -> Exactness:
        args: dict[str, object] = {
            "extra_buffers": False,
            "flash_attn": True,
            "type_k": "f16",
            "type_v": "f16",
            "gpu_layers": 0,
            "tied_output": True,
            **kw,
        }
        return batch_exactness(tensors, F[kind], **args)  # type: ignore[arg-type]

    # SmolLM2's Q8_0 output matrix takes llamafile's sgemm for several rows on x86.
    e = exact(smol, "epyc")
    assert not e.exact and "Q8_0" in e.reason and "sgemm" in e.reason
    assert exact(twin, "epyc").exact and exact(twin, "zen2").exact
    # ... and without llamafile (or AVX) the same file is invariant.
    assert exact(smol, "plain").exact
    # Extra buffers: AMX takes the twin's Q4_1 on a Xeon; nothing repacks it on the EPYC.
    x = exact(twin, "xeon", extra_buffers=True)
    assert not x.exact and "AMX" in x.reason
    assert exact(twin, "epyc", extra_buffers=True).exact
    # ARM's two-row int8 kernel.
    assert not exact(twin, "arm").exact
    # Without flash attention the attention products of a batch take sgemm (f16 K/V).
    assert not exact(twin, "epyc", flash_attn=False).exact
    assert not exact(twin, "epyc", gpu_layers=1).exact
    # Flash attention over f16 K/V is exact only below its split-KV and tiled paths.
    f16 = exact(twin, "epyc")
    assert f16.covers(255, 63) and not f16.covers(256, 1) and not f16.covers(10, 64)
    q8 = exact(twin, "epyc", type_k="q8_0", type_v="q8_0")
    assert q8.exact and q8.covers(100_000, 512)
    assert weights_exactness(twin, F["epyc"], extra_buffers=False, tied_output=True).exact


@pytest.fixture(scope="module")
def twin(exact_smollm2_path: Path) -> Iterator[Model]:
    m = Model(exact_smollm2_path, exact_load(n_ctx=512, n_threads=2, state_cache_mb=0))
    yield m
    m.close()


def last_logits(m: Model, tokens: list[int], split: int) -> np.ndarray:
    """Decode `tokens[:split]` as one batch, then the rest as another; the logits of the last
    token (computed alone when split = len - 1, inside a batch when split = 0)."""
    C = m._lib
    m.reset_cache()
    for chunk in (tokens[:split], tokens[split:]):
        if not chunk:
            continue
        arr = (ctypes.c_int32 * len(chunk))(*chunk)
        assert C.llama_decode(m._ctx, C.llama_batch_get_one(arr, len(chunk))) == 0
    row = C.llama_get_logits_ith(m._ctx, -1)
    out = np.ctypeslib.as_array(row, shape=(m.n_vocab,)).copy()
    m.reset_cache()
    return out


def test_guaranteed_logits_are_bit_identical_alone_and_in_a_batch(twin: Model) -> None:
    """Where the engine promises exactness, llama.cpp really computes the same logits for a
    token decoded alone and inside a prompt batch (the promise is not vacuous)."""
    tokens = twin.chat_tokens([{"role": "user", "content": "Name three colours."}])
    assert twin.exactness.covers(len(tokens), len(tokens)), twin.exactness
    in_batch = last_logits(twin, tokens, 0)
    alone = last_logits(twin, tokens, len(tokens) - 1)
    halves = last_logits(twin, tokens, len(tokens) // 2)
    assert np.array_equal(in_batch, alone) and np.array_equal(in_batch, halves)
