"""Quants made locally, without a model: the types offered, the requantize rule, the sizes a
file must have, the progress read from llama.cpp's log, and a child that cannot start."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, LlamaFileType
from gguf.quants import quantize

from engine.errors import EngineError
from engine.model.gguf import GGUFFile, TensorInfo, read_gguf
from engine.model.quant_types import (
    QUANTIZATION_VERSION,
    QuantizeError,
    RequantizeRefused,
    check_requantize,
    estimate_size,
    layout_size,
    output_name,
    parse_quant_type,
    quant_choices,
    quant_type_names,
    shape_type,
    source_quant,
    tensor_bytes,
)
from engine.native import quantize_process
from engine.native.quantize_child import CHILD_ARG, QuantizeJob

G = GGMLQuantizationType
REPO = Path(__file__).resolve().parents[2]


def _table(
    tensors: list[tuple[str, tuple[int, ...], GGMLQuantizationType]],
    file_type: int | None = None,
    data_offset: int = 4096,
) -> GGUFFile:
    """A header with `tensors` laid out as llama.cpp writes them (32-byte aligned)."""
    infos = []
    at = 0
    for name, shape, kind in tensors:
        n = tensor_bytes(shape, kind)
        infos.append(TensorInfo(name, shape, int(kind), at, n))
        at += (n + 31) // 32 * 32
    meta: dict[str, object] = {"general.architecture": "llama", QUANTIZATION_VERSION: 2}
    if file_type is not None:
        meta["general.file_type"] = file_type
    return GGUFFile(
        "m.gguf", 3, meta, infos, data_offset, data_offset + at, header_end=data_offset - 10
    )


def _smollm2_like(kind: GGMLQuantizationType, file_type: int | None) -> GGUFFile:
    return _table(
        [
            ("token_embd.weight", (576, 49152), G.Q8_0),
            ("blk.0.attn_norm.weight", (576,), G.F32),
            ("blk.0.attn_q.weight", (576, 576), kind),
            ("blk.0.ffn_down.weight", (1536, 576), kind),
        ],
        file_type,
    )


def test_type_names_any_case_and_llama_quantize_aliases() -> None:
    assert parse_quant_type("q4_k_m").name == "Q4_K_M"
    assert parse_quant_type("Q4_K").name == "Q4_K_M"  # llama-quantize's alias
    assert parse_quant_type(" iq4-xs ").name == "IQ4_XS"
    q = parse_quant_type("Q4_K_S")
    assert q.file_type == LlamaFileType.MOSTLY_Q4_K_S and q.base == G.Q4_K
    assert q.bits_per_weight == 4.5
    names = quant_type_names()
    assert names[0] == "F16" and names[-1] == "Q2_K"
    assert {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q6_K", "BF16", "IQ4_NL"} <= set(names)
    # largest first, by the base type's bits per weight
    bits = [parse_quant_type(n).bits_per_weight for n in names]
    assert bits == sorted(bits, reverse=True)


def test_unknown_and_imatrix_types_are_refused_with_the_valid_ones() -> None:
    with pytest.raises(QuantizeError) as e:
        parse_quant_type("Q9_X")
    assert str(e.value) == (
        "unknown quantization type 'Q9_X'; choose one of " + ", ".join(quant_type_names())
    )
    with pytest.raises(QuantizeError, match=r"^IQ2_XS needs an importance matrix.*Q4_K_M"):
        parse_quant_type("iq2_xs")


def test_the_source_main_type_leaves_out_embedding_and_output() -> None:
    src = source_quant(_smollm2_like(G.Q4_1, int(LlamaFileType.MOSTLY_Q4_1)))
    assert src.main_type == G.Q4_1  # the Q8_0 embedding holds more elements, but says less
    assert src.bits_per_weight == 5.0
    assert src.label == "Q4_1"
    assert not src.is_float
    only_edges = _table([("token_embd.weight", (64, 100), G.F16)])
    assert source_quant(only_edges).main_type == G.F16
    with pytest.raises(QuantizeError, match="no weight matrices"):
        source_quant(_table([("norm.weight", (64,), G.F32)]))


def test_requantizing_is_refused_unless_allowed() -> None:
    q4_1 = source_quant(_smollm2_like(G.Q4_1, int(LlamaFileType.MOSTLY_Q4_1)))
    with pytest.raises(RequantizeRefused) as e:
        check_requantize(q4_1, parse_quant_type("Q4_0"), "m.gguf", allow_requantize=False)
    assert str(e.value) == (
        "m.gguf is already quantized (Q4_1, 5.00 bits per weight): quantizing it again to "
        "Q4_0 loses more quality than quantizing its 16-bit original"
    )
    check_requantize(q4_1, parse_quant_type("Q4_0"), "m.gguf", allow_requantize=True)
    check_requantize(q4_1, parse_quant_type("Q2_K"), "m.gguf", allow_requantize=True)
    # more bits than the source: only a bigger file
    with pytest.raises(RequantizeRefused, match=r"^Q8_0 \(8.50 bits per weight\) is not smaller"):
        check_requantize(q4_1, parse_quant_type("Q8_0"), "m.gguf", allow_requantize=False)
    with pytest.raises(RequantizeRefused, match="is not smaller"):
        check_requantize(q4_1, parse_quant_type("Q5_0"), "m.gguf", allow_requantize=False)
    # the same file type is a copy: refused even when allowed
    with pytest.raises(QuantizeError, match=r"^m.gguf is already Q4_1$") as same:
        check_requantize(q4_1, parse_quant_type("Q4_1"), "m.gguf", allow_requantize=True)
    assert not isinstance(same.value, RequantizeRefused)


def test_a_16_bit_source_quantizes_freely() -> None:
    f16 = source_quant(_smollm2_like(G.F16, int(LlamaFileType.MOSTLY_F16)))
    assert f16.is_float and f16.bits_per_weight == 16
    for name in quant_type_names()[2:]:
        check_requantize(f16, parse_quant_type(name), "m.gguf", allow_requantize=False)
    with pytest.raises(RequantizeRefused, match=r"BF16 .* is not smaller"):
        check_requantize(f16, parse_quant_type("BF16"), "m.gguf", allow_requantize=False)


def test_the_choices_for_a_file_say_which_wait_to_be_allowed() -> None:
    q4_1 = _smollm2_like(G.Q4_1, int(LlamaFileType.MOSTLY_Q4_1))
    choices = {c.qtype.name: c for c in quant_choices(q4_1, "m.gguf")}
    assert "Q4_1" not in choices  # its own type
    assert len(choices) == len(quant_type_names()) - 1
    assert choices["Q8_0"].refusal_kind == "not-smaller"
    assert choices["Q5_0"].refusal_kind == "not-smaller"  # 5.5 bits against 5
    assert choices["Q4_0"].refusal_kind == "requantize"
    assert choices["Q4_0"].refusal == (
        "m.gguf is already quantized (Q4_1, 5.00 bits per weight): quantizing it again to "
        "Q4_0 loses more quality than quantizing its 16-bit original"
    )
    assert choices["Q4_0"].exact and not choices["Q4_K_M"].exact
    assert choices["Q4_0"].estimated_bytes == estimate_size(q4_1, parse_quant_type("Q4_0"))
    f16 = quant_choices(_smollm2_like(G.F16, int(LlamaFileType.MOSTLY_F16)), "m.gguf")
    assert [c.qtype.name for c in f16 if c.refusal is not None] == ["BF16"]
    moe = _smollm2_like(G.F16, None)
    moe.metadata["llama.expert_count"] = 8
    assert not any(c.exact for c in quant_choices(moe, "m.gguf"))


def test_shape_fallbacks_follow_llama_cpp() -> None:
    assert shape_type(G.Q4_K, 1536) == G.Q4_K
    assert shape_type(G.Q4_K, 576) == G.Q5_0  # 576 is not a multiple of 256
    assert shape_type(G.Q2_K, 576) == G.Q4_0
    assert shape_type(G.Q6_K, 576) == G.Q8_0
    assert shape_type(G.IQ4_XS, 576) == G.IQ4_NL
    assert shape_type(G.Q4_0, 576) == G.Q4_0
    assert shape_type(G.Q4_0, 100) == G.F16  # not even 32-element blocks fit


def test_layout_size_is_the_header_and_the_padded_tensors() -> None:
    gf = _smollm2_like(G.Q4_1, None)
    blocks = {t.name: GGML_QUANT_SIZES[G(t.ggml_type)] for t in gf.tensors}
    by_hand = 4096 + sum(
        -(-(t.n_elements // blocks[t.name][0] * blocks[t.name][1]) // 32) * 32 for t in gf.tensors
    )
    assert layout_size(gf) == by_hand == gf.file_size
    # the norm's 2304 bytes are already aligned; a 3-element vector is padded to 32
    odd = _table([("a.weight", (3,), G.F32), ("b.weight", (32, 2), G.Q8_0)], data_offset=64)
    assert [t.offset for t in odd.tensors] == [0, 32]
    assert layout_size(odd) == 64 + 32 + 96
    # a tensor out of place does not lie as llama.cpp writes
    moved = GGUFFile(
        "m.gguf", 3, {}, [*odd.tensors[:1], TensorInfo("b", (32, 2), 8, 40, 68)], 64, 0
    )
    assert layout_size(moved) == 0


def test_layout_size_matches_a_file_the_gguf_package_writes(tmp_path: Path) -> None:
    path = tmp_path / "w.gguf"
    w = GGUFWriter(path, "llama")
    w.add_uint32("general.file_type", int(LlamaFileType.MOSTLY_Q8_0))
    rng = np.random.default_rng(7)
    w.add_tensor("token_embd.weight", rng.standard_normal((50, 64)).astype(np.float16))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(5, np.float32))
    q = quantize(rng.standard_normal((96, 64)).astype(np.float32), G.Q8_0)
    w.add_tensor("blk.0.attn_q.weight", q, raw_dtype=G.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    gf = read_gguf(path, check_architecture=False)
    assert layout_size(gf) == path.stat().st_size
    assert [t.n_bytes for t in gf.tensors] == [
        tensor_bytes(t.shape, t.ggml_type) for t in gf.tensors
    ]
    # Q4_0 from it: the matrix in Q4_0, the embedding (also the output: there is no
    # output.weight) in Q6_K, which its 64-element rows do not fit: Q8_0; the norm as it is.
    # The header gains general.quantization_version (8 + 28 + 4 + 4 bytes), then alignment.
    q4 = estimate_size(gf, parse_quant_type("Q4_0"))
    header = -(-(gf.header_end + 44) // 32) * 32
    assert q4 == header + 3424 + 32 + 96 * 64 // 32 * 18  # 50 * 64 // 32 * 34, padded
    # a 16-bit target: every matrix in it
    f16 = estimate_size(gf, parse_quant_type("F16"))
    assert f16 == header + 50 * 64 * 2 + 32 + 96 * 64 * 2


def test_the_estimate_uses_each_row_fallback() -> None:
    gf = _smollm2_like(G.F16, None)
    est = estimate_size(gf, parse_quant_type("Q4_K_M"))
    assert est == (
        gf.data_offset
        + tensor_bytes((576, 49152), G.Q8_0)  # the tied output: Q6_K, whose rows are 256
        + 2304
        + tensor_bytes((576, 576), G.Q5_0)  # 576-element rows cannot be Q4_K
        + tensor_bytes((1536, 576), G.Q4_K)
    )
    untied = _table(
        [
            ("token_embd.weight", (512, 1000), G.F16),
            ("output.weight", (512, 1000), G.F16),
            ("blk.0.attn_q.weight", (512, 512), G.F16),
        ]
    )
    assert estimate_size(untied, parse_quant_type("Q4_K_M")) == (
        untied.data_offset
        + tensor_bytes((512, 1000), G.Q4_K)  # the embedding alone takes the base type
        + tensor_bytes((512, 1000), G.Q6_K)
        + tensor_bytes((512, 512), G.Q4_K)
    )
    # a Q8_0 target keeps the output at Q8_0
    assert estimate_size(untied, parse_quant_type("Q8_0")) == untied.data_offset + sum(
        tensor_bytes(t.shape, G.Q8_0) for t in untied.tensors
    )


def test_output_names_drop_the_source_quantization() -> None:
    q4_0 = parse_quant_type("Q4_0")
    assert output_name(Path("SmolLM2-135M-Instruct.Q4_1.gguf"), q4_0) == (
        "SmolLM2-135M-Instruct-Q4_0.gguf"
    )
    km = parse_quant_type("Q4_K_M")
    assert output_name(Path("gemma-3-270m-q4_k_m.gguf"), km) == "gemma-3-270m-Q4_K_M.gguf"
    assert output_name(Path("a/Llama-3-8B-F16-00001-of-00002.gguf"), km) == "Llama-3-8B-Q4_K_M.gguf"
    assert output_name(Path("Q8_0.gguf"), km) == "model-Q4_K_M.gguf"


def test_progress_is_read_from_the_per_tensor_lines() -> None:
    read = quantize_process.tensor_progress
    assert read("[  12/ 272]              blk.0.attn_k.weight - [  576,   192], type = q4_1, ") == (
        12,
        272,
    )
    assert read("[1000/1000] output.weight - [...]") == (1000, 1000)
    assert read("llama_model_quantize_impl: model size  =    93.8 MiB") is None
    assert read("warning: blk.0.attn_q.weight - ncols 576 not divisible by 256") is None


def test_the_reason_is_llama_cpp_s_own() -> None:
    reason = quantize_process.failure_reason
    line = "[   3/  21] token_embd.weight - [256, 320], type = q4_K, "
    assert reason([line + "llama_model_quantize: failed to quantize: requantizing from type "
                   "q4_K is disabled"]) == "requantizing from type q4_K is disabled"  # fmt: skip
    assert (
        reason(
            [
                "gguf_init_from_file_impl: failed to open GGUF file 'x.gguf' (No such file)",
                "llama_model_quantize: failed to quantize: llama_model_loader: failed to load "
                "model from x.gguf",
            ]
        )
        == "failed to open GGUF file 'x.gguf' (No such file)"
    )


@pytest.fixture
def stand_in_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """sys.executable is an app that runs the bundle's entry point; sys.frozen is set."""
    exe = tmp_path / "candlewick"
    main = REPO / "installers" / "candlewick_main.py"
    exe.write_text(f'#!/bin/sh\nPYTHONPATH="{REPO}" exec "{sys.executable}" "{main}" "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "executable", str(exe))
    monkeypatch.chdir(tmp_path)
    return exe


@pytest.mark.skipif(sys.platform == "win32", reason="a shell script stands in for the app")
def test_a_frozen_app_runs_the_quantizer_as_itself(stand_in_app: Path, tmp_path: Path) -> None:
    assert quantize_process.child_command() == [str(stand_in_app), CHILD_ARG]
    job = QuantizeJob(str(tmp_path / "none.gguf"), str(tmp_path / "out.gguf"), 2)
    with pytest.raises(EngineError) as e:  # llama.cpp ran in the child, and refused
        quantize_process.run_quantize(job)
    assert str(e.value).startswith("llama.cpp could not quantize none.gguf: failed to open GGUF")
    stand_in_app.write_text("#!/bin/sh\necho 'error: the bundle is damaged' >&2\nexit 3\n")
    with pytest.raises(EngineError) as e:
        quantize_process.run_quantize(job)
    assert str(e.value) == (
        "could not start the quantizing helper process (exit code 3): error: the bundle is damaged"
    )
