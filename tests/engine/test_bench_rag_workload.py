"""The `rag` workload on a collection, without a model: questions read from a file, each
retrieved (a fake search over fixed passages) and timed, grounded prompts within the budget,
and the retrieval figures in the result's JSON and its summary."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.bench.rag_workload import grounded_workload, load_questions
from engine.bench.report import format_table, summary_lines
from engine.bench.result import BenchResult, RetrievalReport
from engine.bench.workloads import WorkloadError
from engine.rag.grounding import INSTRUCTIONS
from engine.rag.search import Hit

QUESTIONS_JSON = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "rag_questions.json"


def words(text: str) -> int:
    return len(text.split())


def hit(path: Path, text: str, n: int) -> Hit:
    return Hit(
        chunk_id=n,
        path=path,
        page=None,
        heading=None,
        start=0,
        end=len(text),
        text=text,
        score=1.0 / n,
    )


class Clock:
    """Each retrieval takes the next of `steps_ms`; all else takes no time."""

    def __init__(self, steps_ms: list[float]) -> None:
        self.now = 0.0
        self._steps: Iterator[float] = iter(steps_ms)
        self._inside = False

    def __call__(self) -> float:
        if self._inside:
            self.now += next(self._steps) / 1000
        self._inside = not self._inside
        return self.now


def test_prompts_are_grounded_and_retrieval_is_timed_apart(tmp_path: Path) -> None:
    doc = tmp_path / "notes.txt"
    short = "The pass statement does nothing."
    long = "A lambda makes a small anonymous function of one expression. " * 20
    doc.write_text(short + "\n" + long, encoding="utf-8")
    passages = {
        "what does pass do?": [hit(doc, short, 1), hit(doc, long, 2)],
        "nothing matches": [],
    }
    asked: list[str] = []

    def retrieve(q: str) -> list[Hit]:
        asked.append(q)
        return passages[q]

    questions = ["what does pass do?", "nothing matches", "what does pass do?"]
    workload, report = grounded_workload(
        questions,
        retrieve,
        words,
        collection="ref",
        k=5,
        budget=60,
        clock=Clock([10.0, 30.0, 20.0]),
    )
    assert asked == questions
    first, unmatched, third = workload.prompts
    system, user = first.messages
    assert system["role"] == "system" and user == {"role": "user", "content": questions[0]}
    # The long passage does not fit 60 words beside the short one: only [1] is given.
    assert system["content"] == f"{INSTRUCTIONS}\n\n[1] notes.txt, line 1\n{short}"
    assert "[2]" not in system["content"]
    assert unmatched.messages == ({"role": "user", "content": "nothing matches"},)
    assert third.messages == first.messages and first.id != third.id
    assert workload.name == "rag" and first.max_tokens > 0

    assert (report.collection, report.questions, report.k, report.budget) == ("ref", 3, 5, 60)
    assert report.ms_p50 == pytest.approx(20.0)
    assert report.ms_p95 == pytest.approx(29.0)
    assert report.ms_max == pytest.approx(30.0)
    assert report.mean_passages == pytest.approx(2 / 3)
    assert report.mean_tokens == pytest.approx(2 * words(system["content"]) / 3)


def test_a_larger_budget_takes_both_passages(tmp_path: Path) -> None:
    a, b = "first passage text", "second passage text"
    workload, report = grounded_workload(
        ["q"],
        lambda q: [hit(tmp_path / "x.txt", a, 1), hit(tmp_path / "y.txt", b, 2)],
        words,
        collection="ref",
        k=2,
        budget=1000,
    )
    content = workload.prompts[0].messages[0]["content"]
    assert "[1] x.txt\nfirst passage text" in content
    assert "[2] y.txt\nsecond passage text" in content
    assert report.mean_passages == 2 and report.mean_tokens == words(content)
    assert 0 <= report.ms_p50 <= report.ms_p95 <= report.ms_max


def test_questions_from_text_and_json(tmp_path: Path) -> None:
    txt = tmp_path / "q.txt"
    txt.write_text("How do I swap?\n\n  What is pass?  \n", encoding="utf-8")
    assert load_questions(txt) == ["How do I swap?", "What is pass?"]
    strings = tmp_path / "s.json"
    strings.write_text(json.dumps(["one?", "two?"]), encoding="utf-8")
    assert load_questions(strings) == ["one?", "two?"]
    shipped = load_questions(QUESTIONS_JSON)
    raw = json.loads(QUESTIONS_JSON.read_text(encoding="utf-8"))
    assert shipped == [item["q"] for item in raw] and len(shipped) > 10


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("empty.txt", "\n  \n", "empty.txt has no questions"),
        ("bad.json", "{", "bad.json is not valid JSON"),
        ("obj.json", '{"q": "x"}', "obj.json: expected a JSON list of questions"),
        ("item.json", '["ok", {"question": "x"}]', "item.json item 2: expected a question"),
        ("none.json", "[]", "none.json has no questions"),
    ],
)
def test_bad_questions_files(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(WorkloadError, match=message):
        load_questions(path)


def test_a_missing_questions_file(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="no such questions file"):
        load_questions(tmp_path / "nope.txt")


def test_retrieval_round_trips_in_the_json_and_is_summarised() -> None:
    report = RetrievalReport(
        collection="notes",
        questions=20,
        k=5,
        ms_p50=12.2,
        ms_p95=18.6,
        ms_max=25.0,
        mean_passages=4.1,
        mean_tokens=640.4,
        budget=1024,
    )
    result = BenchResult(retrieval=report)
    data = json.loads(result.to_json())
    assert data["retrieval"]["ms_p95"] == 18.6
    back = BenchResult.from_dict(data)
    assert back.retrieval == report and back.to_dict() == data
    line = (
        "Retrieval (before each prompt, not in TTFT): p50 12 ms, p95 19 ms over 20 questions "
        "of 'notes'; adds 640 tokens (4.1 passages) a prompt"
    )
    assert summary_lines(result) == [line]
    assert format_table(result).endswith(line)
    # A result without retrieval writes no such key, so older files read back unchanged.
    assert "retrieval" not in BenchResult().to_dict()
    assert BenchResult.from_dict(BenchResult().to_dict()).retrieval is None
