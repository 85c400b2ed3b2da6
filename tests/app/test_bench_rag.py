"""`candlewick bench --workload rag --collection NAME --questions FILE` in-process, in a private
home: a collection of a few files indexed with the real MiniLM, each question retrieved and
timed before the bundled SmolLM2 answers its grounded prompt; and its bad input, one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from tests.app.cli_errors import one_line_error
from tests.engine.rag.helpers import topic_files

FAST = ["--requests", "3", "--max-tokens", "8", "--warmup", "0", "--concurrency", "1"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_bench_on_a_collection(
    tmp_path: Path, minilm_path: Path, smollm2_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topic_files(tmp_path / "docs", 4)
    rc, _, err = run(
        capsys, "docs", "add", "ref", str(tmp_path / "docs"), "--embedding-model", str(minilm_path)
    )
    assert rc == 0, err
    rc, _, err = run(capsys, "docs", "index", "ref", "--json")
    assert rc == 0, err
    questions = tmp_path / "questions.json"
    asked = [
        "Which statement does nothing at all when it is executed?",
        "How do I leave a loop early?",
        {"q": "What does the continue statement do?"},
    ]
    questions.write_text(json.dumps(asked), encoding="utf-8")
    out_file = tmp_path / "r.json"
    rc, out, err = run(
        capsys,
        "bench",
        "--model",
        str(smollm2_path),
        "--workload",
        "rag",
        "--collection",
        "ref",
        "--questions",
        str(questions),
        "-k",
        "3",
        "--no-bandwidth",
        "--out",
        str(out_file),
        *FAST,
    )
    assert rc == 0, err
    assert "Retrieval (before each prompt, not in TTFT): p50 " in out
    assert "over 3 questions of 'ref'; adds " in out
    result = json.loads(out_file.read_text(encoding="utf-8"))
    rt = result["retrieval"]
    assert (rt["collection"], rt["questions"], rt["k"]) == ("ref", 3, 3)
    assert 0 < rt["ms_p50"] <= rt["ms_p95"] <= rt["ms_max"] < 10_000
    # Each prompt was given passages (up to k), and they fit the budget.
    assert 1 <= rt["mean_passages"] <= 3
    assert 0 < rt["mean_tokens"] <= rt["budget"]
    assert result["workload"]["name"] == "rag" and result["workload"]["prompts"] == 3
    level = result["levels"][0]
    assert level["succeeded"] == level["requests"] == 3, level["error_samples"]
    # TTFT now measures the prefill of the grounded prompts: far more than the question alone.
    traces = result["traces"]["1"]
    assert all(t["prompt_tokens"] > rt["mean_tokens"] / 2 for t in traces), traces


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--workload", "chat", "--collection", "ref", "--questions", "q.txt"],
            "--collection and --questions go with --workload rag",
        ),
        (["--workload", "rag", "--collection", "ref"], "needs both --collection and --questions"),
        (
            ["--workload", "rag", "--collection", "ref", "--questions", "missing.txt"],
            "no such questions file",
        ),
        (
            ["--workload", "rag", "--collection", "nope", "--questions", "q.txt"],
            "no collection named 'nope' (collections: none yet)",
        ),
        # Accepted only where they are used: never taken and ignored.
        (["--workload", "rag", "-k", "3"], "-k and --rag-budget go with --workload rag"),
        (["--workload", "chat", "--rag-budget", "500"], "-k and --rag-budget go with"),
    ],
)
def test_bad_input_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    (tmp_path / "q.txt").write_text("What is pass?\n", encoding="utf-8")
    args = [str(tmp_path / a) if a.endswith(".txt") else a for a in args]
    rc, _, err = run(capsys, "bench", *args)
    assert rc == 2
    assert message in one_line_error(err)
