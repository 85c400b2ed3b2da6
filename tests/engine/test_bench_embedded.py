"""The benchmark on the chat's loaded model: the context sized from the workload with the real
tokenizer, and the model's loop given back afterwards."""

from __future__ import annotations

from pathlib import Path

from engine.bench.embedded import TAG_TOKENS, context_per_request, run_loaded_benchmark
from engine.bench.harness import BenchConfig, Tokenizer
from engine.bench.workloads import Workload, load_workload
from engine.host.runtime import Model
from engine.settings import LoadParams


def test_context_fits_the_longest_prompt_with_its_answer(smollm2_path: Path) -> None:
    rag = load_workload("rag")
    n_ctx = context_per_request(smollm2_path, rag, None)
    tok = Tokenizer(smollm2_path)
    try:
        need = max(tok.count_chat(p.messages) + p.max_tokens for p in rag.prompts)
    finally:
        tok.close()
    assert n_ctx % 256 == 0
    assert need + TAG_TOKENS <= n_ctx < need + TAG_TOKENS + 256
    assert n_ctx > 3200  # the rag prompts are 3.2k-3.9k tokens
    # A cap on the answers shrinks it; the chat set is far smaller.
    assert context_per_request(smollm2_path, rag, 8) <= n_ctx
    assert context_per_request(smollm2_path, load_workload("chat"), 8) <= 512


def test_a_run_on_the_loaded_model_gives_its_loop_back(smollm2_path: Path) -> None:
    """The benchmark runs on the chat's model, sized for the run, then hands the loop back."""
    with Model(smollm2_path, LoadParams(n_ctx=1024, n_threads=2)) as m:
        loop = m.loop
        w = load_workload("chat")
        cfg = BenchConfig(concurrency=[1, 2], requests=2, max_tokens=4, unique_prompts=False)
        seen: list[tuple[int, str | None]] = []
        result = run_loaded_benchmark(
            m,
            Workload("chat", w.prompts[:2], w.source),
            cfg,
            progress=lambda p: seen.append((loop.n_slots, loop.leased_by)),
        ).to_dict()
        assert [lv["concurrency"] for lv in result["levels"]] == [1, 2]
        assert (2, "benchmark") in seen  # it ran with two sequences of its own
        assert (loop.n_slots, loop.n_ctx_seq, loop.leased_by) == (1, 1024, None)
        assert m.generate([{"role": "user", "content": "Hi"}]).consume()  # the chat goes on
