"""The quant choice on hand-made rows: the smallest file within the KL divergence limit, that
fits and reaches the speed; the reference when no candidate is good enough; one sentence why
none; the speed's source named; the choice kept beside a quality result still reads back as
one (so `bench compare` takes the file)."""

from __future__ import annotations

import json
from pathlib import Path

from engine.bench.quality_result import QualityResult
from engine.bench.quant_choice import (
    CHOICE_KEY,
    FileMemory,
    FileSpeed,
    QuantChoice,
    QuantOption,
    SpeedSource,
    Thresholds,
    choose,
    format_choice_table,
    options_of,
)
from tests.quant_rows import ROWS, quality_result


def _options(
    speeds: dict[str, float], fits: dict[str, bool] | None = None, source: SpeedSource = "measured"
) -> list[QuantOption]:
    r = quality_result(*ROWS)
    sp = {f"/m/{n}": FileSpeed(tokens_per_s=v, source=source) for n, v in speeds.items()}
    mem = {
        f"/m/{n}": FileMemory(total_bytes=1, fits=(fits or {}).get(n, True), verdict_text="x")
        for n in ["ref-Q8_0.gguf", *(row[0] for row in ROWS)]
    }
    return options_of(r, sp, mem)


SPEEDS = {"ref-Q8_0.gguf": 90.0, "m-Q4_1.gguf": 120.0, "m-Q4_0.gguf": 130.0, "m-Q2_K.gguf": 150.0}


def test_no_limits_choose_the_smallest_file() -> None:
    c = choose(_options(SPEEDS), Thresholds())
    assert c.chosen == "m-Q2_K.gguf"
    assert c.sentence.startswith("Run m-Q2_K.gguf: the smallest of the 4 files that qualify")
    assert "150 tokens/s measured" in c.sentence


def test_a_kld_limit_moves_the_choice_up_in_size() -> None:
    c = choose(_options(SPEEDS), Thresholds(max_kld=0.05))
    assert c.chosen == "m-Q4_0.gguf"
    assert c.excluded == {"m-Q2_K.gguf": "KL divergence 0.4000 is over 0.05"}
    assert "KL divergence 0.0300 within 0.05" in c.sentence
    c = choose(_options(SPEEDS), Thresholds(max_kld=0.02))
    assert c.chosen == "m-Q4_1.gguf"


def test_the_reference_when_no_candidate_is_close_enough() -> None:
    c = choose(_options(SPEEDS), Thresholds(max_kld=0.001))
    assert c.chosen == "ref-Q8_0.gguf"
    assert c.sentence.startswith("Run ref-Q8_0.gguf (the reference): the only file that qualifies")


def test_speed_and_memory_leave_files_out() -> None:
    c = choose(
        _options(SPEEDS, fits={"m-Q4_0.gguf": False}),
        Thresholds(max_kld=0.05, min_tokens_per_s=100),
    )
    # Q2_K is too lossy, Q4_0 does not fit, the reference is too slow: Q4_1 is left.
    assert c.chosen == "m-Q4_1.gguf"
    assert c.excluded["m-Q4_0.gguf"].startswith("does not fit in memory")
    assert c.excluded["ref-Q8_0.gguf"] == "90 tokens/s (measured) is under 100"


def test_why_none_in_one_sentence() -> None:
    c = choose(_options(SPEEDS, source="predicted"), Thresholds(max_kld=0.02, min_tokens_per_s=125))
    assert c.chosen is None
    assert c.sentence == (
        "None of the 4 files qualifies: ref-Q8_0.gguf 90 tokens/s (predicted) is under 125; "
        "m-Q4_1.gguf 120 tokens/s (predicted) is under 125; "
        "m-Q4_0.gguf KL divergence 0.0300 is over 0.02; "
        "m-Q2_K.gguf KL divergence 0.4000 is over 0.02."
    )
    assert c.sentence.count(".") == c.sentence.count(".gguf") + 5  # one sentence: one stop


def test_an_unknown_speed_fails_only_a_speed_limit() -> None:
    opts = _options({})
    assert choose(opts, Thresholds()).chosen == "m-Q2_K.gguf"
    assert "speed not known" in choose(opts, Thresholds()).sentence
    c = choose(opts, Thresholds(min_tokens_per_s=10))
    assert c.chosen is None
    assert set(c.excluded.values()) == {"its speed is not known"}


def test_the_table_and_the_json_beside_a_quality_result(tmp_path: Path) -> None:
    r = quality_result(*ROWS)
    c = choose(_options(SPEEDS), Thresholds(max_kld=0.05))
    table = format_choice_table(c)
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["file", "type", "size", "KLD"]
    assert "ref-Q8_0.gguf (the reference)" in lines[1]
    q40 = next(line for line in lines if line.startswith("m-Q4_0.gguf"))
    assert "130" in q40 and "<- chosen" in q40
    assert lines[-1] == c.sentence
    path = tmp_path / "q.json"
    path.write_text(
        json.dumps({**r.to_dict(), CHOICE_KEY: c.model_dump(mode="json")}), encoding="utf-8"
    )
    assert QualityResult.load(path) == r
    back = QuantChoice.model_validate(json.loads(path.read_text(encoding="utf-8"))[CHOICE_KEY])
    assert back == c
