"""`bench quality` on the real SmolLM2: a file against itself gives a KL divergence of 0 and
agrees on every top token, decoded on the model's loop thread; the reference comes from the
cache the second time; a Q2_K made from it scores worse than a Q4_0; and the CLI with
--make, --json, --out and `bench compare`. Short: a small context and two chunks."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cli import main
from engine.bench.quality import QualitySetup, run_quality, scoring_load_params
from engine.bench.quality_result import QualityResult
from engine.bench.quality_text import builtin_text
from engine.host.runtime import Model
from engine.model.quantize import quantize_file
from engine.native.backend import LlamaBackend

pytestmark = pytest.mark.slow

CTX = 128
CHUNKS = 2


def _load(path: Path) -> Model:
    return Model(path, scoring_load_params(2))


@pytest.fixture(scope="module")
def quants(
    smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Path]]:
    """Q4_0 and Q2_K made from the bundled Q4_1 with llama.cpp's quantizer."""
    folder = tmp_path_factory.mktemp("quants")
    made = {}
    for qtype in ("Q4_0", "Q2_K"):
        target = folder / f"smollm2-{qtype}.gguf"
        quantize_file(smollm2_path, target, qtype, allow_requantize=True)
        made[qtype] = target
    yield made


def test_a_file_against_itself_scores_zero_on_the_loop_thread(
    smollm2_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: set[str] = set()
    decode = LlamaBackend.decode

    def watched(self: LlamaBackend, *args: object, **kw: bool) -> None:
        threads.add(threading.current_thread().name)
        decode(self, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(LlamaBackend, "decode", watched)
    setup = QualitySetup(ctx=CTX, max_chunks=CHUNKS, cache_dir=tmp_path)
    r = run_quality(smollm2_path, [smollm2_path], builtin_text(), setup, load=_load)
    assert threads == {"candlewick-decode"}
    assert r.chunks == CHUNKS and r.scored_tokens == CHUNKS * (CTX - 1 - CTX // 2)
    c = r.candidates[0]
    assert abs(c.kld_mean) <= 1e-6 and abs(c.kld_max) <= 1e-6
    assert c.top1_agreement == 1.0
    assert c.ppl == pytest.approx(r.reference.ppl, rel=1e-6)
    assert c.dp_rms <= 1e-6
    assert 1.0 < r.reference.ppl < 1000.0 and r.reference.ppl_err > 0
    assert not r.reference.cached
    # Again: the reference's scores come from the cache, and the figures are the same.
    again = run_quality(smollm2_path, [smollm2_path], builtin_text(), setup, load=_load)
    assert again.reference.cached
    assert again.reference.ppl == r.reference.ppl
    assert again.candidates[0].kld_mean == c.kld_mean
    assert len(list(tmp_path.glob("reference-*.npz"))) == 1


def test_a_q2_k_scores_worse_than_a_q4_0(
    smollm2_path: Path, quants: dict[str, Path], tmp_path: Path
) -> None:
    setup = QualitySetup(ctx=CTX, max_chunks=CHUNKS, cache_dir=tmp_path)
    r = run_quality(
        smollm2_path, [quants["Q4_0"], quants["Q2_K"]], builtin_text(), setup, load=_load
    )
    q4, q2 = r.candidates
    assert q4.quantization == "Q4_0" and q2.quantization == "Q2_K"
    assert 0 < q4.kld_mean < q2.kld_mean
    assert q4.kld_median < q2.kld_median
    assert q2.top1_agreement < q4.top1_agreement < 1.0
    assert q2.ppl > q4.ppl
    assert q2.dp_rms > q4.dp_rms


def test_the_cli_makes_a_quant_and_writes_a_result_compare_reads(
    smollm2_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("CANDLEWICK_HOME", str(tmp_path / "home"))
    out = tmp_path / "q.json"
    argv = ["bench", "quality", "--reference", str(smollm2_path), "--make", "Q4_0"]
    argv += ["--ctx", "64", "--chunks", "2", "--threads", "2", "--json", "--out", str(out)]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["schema"] == "candlewick-quality/1"
    row = printed["candidates"][0]
    assert row["made_from"] == "Q4_0" and row["quantization"] == "Q4_0"
    assert row["kld_mean"] > 0 and 0 < row["top1_agreement"] < 1
    assert printed["text"]["source"] == "built-in corpus" and printed["ctx"] == 64
    assert QualityResult.load(out).candidates[0].kld_mean == row["kld_mean"]
    made = list((tmp_path / "home" / "cache" / "quality" / "quants").glob("*.gguf"))
    assert [p.name for p in made] == [Path(row["path"]).name]
    assert main(["bench", "compare", str(out), str(out), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["ratio"] for r in rows} == {1.0}
