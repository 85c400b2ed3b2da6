"""The `rag` workload on a real collection: each question retrieved first, timed on its own,
and turned into a grounded prompt (the numbered passages in a system message, the question as
the user's). The benchmark then runs those prompts as any workload, so its TTFT is the prefill
of the grounded prompt and retrieval is reported apart (`RetrievalReport`).

Loading the index and the models is the caller's: this takes a `retrieve` callable (question
to ranked hits) and a `count_tokens` callable (the chat model's tokenizer).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.bench.metrics import percentile
from engine.bench.result import RetrievalReport
from engine.bench.workloads import DEFAULT_MAX_TOKENS, Prompt, Workload, WorkloadError
from engine.rag.grounding import CountTokens, ground

if TYPE_CHECKING:
    from engine.rag.search import Hit

Retrieve = Callable[[str], Sequence["Hit"]]
# A quarter of a 4096-token context: what the chat grants retrieval by default.
DEFAULT_BUDGET = 1024


def load_questions(path: Path) -> list[str]:
    """Questions from a .txt file (one a line) or a JSON list of strings or of objects with
    "q"; `WorkloadError` (one line) for a file that holds none."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise WorkloadError(f"no such questions file: {path}") from None
    except UnicodeDecodeError:
        raise WorkloadError(f"{path.name} is not UTF-8 text") from None
    except OSError as e:
        raise WorkloadError(f"cannot read {path.name}: {e.strerror or e}") from None
    if path.suffix.lower() == ".json":
        questions = _json_questions(text, path.name)
    else:
        questions = [line.strip() for line in text.splitlines() if line.strip()]
    if not questions:
        raise WorkloadError(f"{path.name} has no questions")
    return questions


def _json_questions(text: str, fname: str) -> list[str]:
    try:
        data: Any = json.loads(text)
    except ValueError:
        raise WorkloadError(f"{fname} is not valid JSON") from None
    if not isinstance(data, list):
        raise WorkloadError(f"{fname}: expected a JSON list of questions")
    out = []
    for n, item in enumerate(data, 1):
        q = item.get("q") if isinstance(item, dict) else item
        if not isinstance(q, str) or not q.strip():
            raise WorkloadError(f"{fname} item {n}: expected a question or an object with 'q'")
        out.append(q.strip())
    return out


def grounded_workload(
    questions: Sequence[str],
    retrieve: Retrieve,
    count_tokens: CountTokens,
    *,
    collection: str,
    k: int,
    budget: int = DEFAULT_BUDGET,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    source: str = "",
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[Workload, RetrievalReport]:
    """One prompt per question, and the retrieval figures. Only `retrieve` is timed: fitting
    the passages to the budget counts the chat model's tokens, which a chat does as part of
    building the prompt, not of searching."""
    prompts: list[Prompt] = []
    times_ms: list[float] = []
    passages = tokens = 0
    for n, question in enumerate(questions, 1):
        t0 = clock()
        hits = retrieve(question)
        times_ms.append((clock() - t0) * 1000)
        g = ground(hits, count_tokens, budget, collections=(collection,))
        passages += len(g.sources)
        tokens += g.tokens
        system = ({"role": "system", "content": g.text},) if g.text else ()
        prompts.append(
            Prompt(
                id=f"{collection}:{n}",
                messages=(*system, {"role": "user", "content": question}),
                max_tokens=max_tokens,
            )
        )
    if not prompts:
        raise WorkloadError("no questions to ask")
    report = RetrievalReport(
        collection=collection,
        questions=len(prompts),
        k=k,
        ms_p50=percentile(times_ms, 50) or 0.0,
        ms_p95=percentile(times_ms, 95) or 0.0,
        ms_max=max(times_ms),
        mean_passages=passages / len(prompts),
        mean_tokens=tokens / len(prompts),
        budget=budget,
    )
    workload = Workload(name="rag", prompts=tuple(prompts), source=source or collection)
    return workload, report


__all__ = ["DEFAULT_BUDGET", "Retrieve", "grounded_workload", "load_questions"]
