"""`bench quality --max-kld --min-speed` on SmolLM2 and a Q4_0 made from it: the table with
speed and memory columns and the recommendation; --json and --out carry the choice, and the
file is still a quality result `bench compare` reads. Speeds as the chat measured them (the
records), so no speed probe runs. A negative limit is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from app.services.paths import AppPaths
from app.services.speed_records import SpeedService, file_key
from engine.bench.quant_choice import CHOICE_KEY
from engine.model.quantize import quantize_file

pytestmark = pytest.mark.slow


@pytest.fixture
def q4_0(smollm2_path: Path, tmp_path: Path) -> Path:
    target = tmp_path / "smollm2-Q4_0.gguf"
    quantize_file(smollm2_path, target, "Q4_0", allow_requantize=True)
    speed = SpeedService(AppPaths.default().data)
    for path, tps in ((smollm2_path, 100.0), (target, 125.0)):
        speed.records.measured(file_key(path.name, path.stat().st_size), tps)
    return target


def test_the_recommendation_in_the_table_the_json_and_the_file(
    smollm2_path: Path, q4_0: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["bench", "quality", "--reference", str(smollm2_path), str(q4_0)]
    base += ["--ctx", "64", "--chunks", "1", "--threads", "2", "--quiet"]
    assert main([*base, "--max-kld", "10", "--min-speed", "110"]) == 0
    out = capsys.readouterr().out
    assert "gen t/s" in out and "memory" in out
    # The quality table first, then the choice's table with speed and memory.
    row = [line for line in out.splitlines() if line.startswith("smollm2-Q4_0.gguf")][-1]
    assert "125" in row and "measured" in row and "<- chosen" in row
    # The reference is too slow: Q4_0 is the only file left.
    assert (
        out.rstrip()
        .splitlines()[-1]
        .startswith("Run smollm2-Q4_0.gguf: the only file that qualifies (92 MB; KL divergence")
    )

    saved = tmp_path / "q.json"
    assert main([*base, "--max-kld", "0", "--json", "--out", str(saved)]) == 0
    printed = json.loads(capsys.readouterr().out)
    choice = printed[CHOICE_KEY]
    assert choice["chosen"] == smollm2_path.name  # KL divergence 0: only the reference
    assert choice["thresholds"] == {"max_kld": 0.0, "min_tokens_per_s": None}
    assert choice["excluded"]["smollm2-Q4_0.gguf"].startswith("KL divergence")
    opts = {o["name"]: o for o in choice["options"]}
    assert opts["smollm2-Q4_0.gguf"]["speed"]["source"] == "measured"
    assert opts["smollm2-Q4_0.gguf"]["memory"]["fits"] is True
    assert json.loads(saved.read_text(encoding="utf-8")) == printed
    assert main(["bench", "compare", str(saved), str(saved), "--json"]) == 0
    assert {r["ratio"] for r in json.loads(capsys.readouterr().out)} == {1.0}


def test_a_negative_limit_is_refused_before_any_pass(
    smollm2_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "quality", "--reference", str(smollm2_path), str(smollm2_path)]
    assert main([*argv, "--quiet", "--min-speed", "-5"]) == 2
    assert "--min-speed must be a number of 0 or more, not -5.0" in capsys.readouterr().err
    assert main([*argv, "--quiet", "--max-kld", "nan"]) == 2
    assert "--max-kld must be a number of 0 or more, not nan" in capsys.readouterr().err
