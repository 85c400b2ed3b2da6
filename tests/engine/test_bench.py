"""The benchmark harness on the real engine with SmolLM2: every field, checked independently."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from engine.bench.harness import (
    BenchConfig,
    EmbeddedTarget,
    SchedulerTarget,
    Tokenizer,
    run_benchmark,
    tag_prompt,
)
from engine.bench.hw import PeakSampler, machine_context, measure_read_bandwidth
from engine.bench.result import BenchError
from engine.bench.workloads import Prompt, Workload, load_workload
from engine.host.runtime import Model
from engine.host.scheduler import Scheduler
from engine.settings import LoadParams

LEVEL_FIELDS = (
    "ttft_p50",
    "ttft_p95",
    "latency_p50",
    "latency_p95",
    "prompt_tps_p50",
    "gen_tps_p50",
    "total_throughput_tps",
    "failure_rate",
    "peak_ram_bytes",
    "engine_prompt_tps_p50",
    "engine_gen_tps_p50",
)


def small_workload(n: int = 3) -> Workload:
    w = load_workload("chat")
    return Workload("chat", w.prompts[:n], w.source)


def test_embedded_run_produces_every_field(smollm2: Model) -> None:
    w = small_workload()
    cfg = BenchConfig(
        concurrency=[1],
        requests=3,
        max_tokens=12,
        slo_ttft_s=60.0,
        bandwidth_bytes=64 << 20,
        unique_prompts=False,
    )
    seen: list[tuple[str, int]] = []
    r = run_benchmark(
        EmbeddedTarget(smollm2),
        w,
        cfg,
        model_file=smollm2.gguf,
        progress=lambda p: seen.append((p.phase, p.done)),
    ).to_dict()
    json.dumps(r)  # JSON-ready as it is
    (lv,) = r["levels"]
    for f in LEVEL_FIELDS:
        assert lv[f] is not None, f
    assert lv["succeeded"] == 3 and lv["failure_rate"] == 0.0
    assert lv["peak_vram_bytes"] is None  # no GPU here: unknown, not zero
    assert r["max_concurrency_meeting_slo"] == 1
    assert ("warmup", 0) in seen and ("run", 3) in seen and seen[-1][0] == "bandwidth"
    # Token counts: the engine's, equal to an independent tokenisation of each prompt.
    traces = r["traces"]["1"]
    for t, p in zip(traces, w.prompts, strict=True):
        assert t["prompt_tokens"] == len(smollm2.chat_tokens(list(p.messages)))
        assert 1 <= t["completion_tokens"] <= 12
        assert 0 < t["ttft"] <= t["latency"]
        assert t["token_source"] == "engine"
    assert lv["completion_tokens"] == sum(t["completion_tokens"] for t in traces)
    # The wall-clock decode rate and llama.cpp's own counters agree on the order of magnitude.
    assert 0.3 * lv["engine_gen_tps_p50"] <= lv["gen_tps_p50"] <= 3 * lv["engine_gen_tps_p50"]
    # Roofline: a decode speed limit above what was achieved.
    rf = r["roofline"]
    assert rf["bytes_per_token"] > 80 << 20
    assert rf["limit_tps"] == pytest.approx(rf["bandwidth_gb_s"] * 1e9 / rf["bytes_per_token"])
    assert 0 < rf["achieved_pct"] < 100
    m = r["machine"]
    assert m["cores_logical"] >= 1 and m["ram_bytes"] > 0 and "CPU" in m["llama_cpp_system_info"]
    t = r["target"]
    assert t["quantization"] and t["n_ctx"] == smollm2.n_ctx and t["weights_bytes"] > 0


def test_embedded_refuses_concurrency_it_cannot_run(smollm2: Model) -> None:
    with pytest.raises(BenchError, match="at most 1 request"):
        run_benchmark(EmbeddedTarget(smollm2), small_workload(), BenchConfig(concurrency=[1, 2]))


def test_prompt_longer_than_context_is_a_failure_not_a_crash(smollm2: Model) -> None:
    huge = Prompt("huge", ({"role": "user", "content": "word " * 3000},), 8)
    w = Workload("x", (huge, small_workload(1).prompts[0]), "test")
    r = run_benchmark(
        EmbeddedTarget(smollm2),
        w,
        BenchConfig(requests=2, max_tokens=4, warmup=0, measure_bandwidth=False),
    ).to_dict()
    (lv,) = r["levels"]
    assert (lv["succeeded"], lv["errors"]) == (1, 1)
    assert "context holds" in lv["error_samples"][0]


@pytest.fixture(scope="module")
def batched(smollm2_path: Path) -> Iterator[tuple[Model, Scheduler]]:
    model = Model(smollm2_path, LoadParams(n_ctx=1024 * 2, n_seq_max=2, n_threads=2))
    yield model, model.loop
    model.close()


def test_scheduler_target_runs_concurrent_requests(batched: tuple[Model, Scheduler]) -> None:
    model, _ = batched
    w = small_workload(4)
    r = run_benchmark(
        SchedulerTarget(model),
        w,
        BenchConfig(
            concurrency=[1, 2], requests=4, max_tokens=8, measure_bandwidth=False, run_tag="abcdef"
        ),
    ).to_dict()
    assert [lv["concurrency"] for lv in r["levels"]] == [1, 2]
    for lv in r["levels"]:
        assert lv["succeeded"] == 4, lv["error_samples"]
        for f in ("ttft_p50", "ttft_p95", "latency_p95", "gen_tps_p50", "peak_ram_bytes"):
            assert lv[f] is not None, f
    # At concurrency 2 two requests really overlapped in time.
    tr = sorted(r["traces"]["2"], key=lambda t: t["t_start"])
    assert tr[1]["t_start"] < tr[0]["t_end"]
    # Each level starts further into the workload; every request carries a unique tag.
    for t in tr:
        p = w.prompts[(4 + t["index"]) % len(w.prompts)]
        tagged = tag_prompt(p, "abcdef-1-" + str(t["index"]))
        assert t["prompt_tokens"] == len(model.chat_tokens(list(tagged.messages)))
    assert r["target"]["mode"] == "scheduler"
    with pytest.raises(BenchError, match="at most 2"):
        run_benchmark(SchedulerTarget(model), w, BenchConfig(concurrency=[4]))


def test_unique_tags_defeat_prefix_caching(smollm2: Model) -> None:
    p = small_workload(1).prompts[0]
    a, b = tag_prompt(p, "x1-0-0"), tag_prompt(p, "x1-0-1")
    ta, tb = (smollm2.chat_tokens(list(x.messages)) for x in (a, b))
    plain = smollm2.chat_tokens(list(p.messages))

    def shared(x: list[int], y: list[int]) -> int:
        return next(
            (i for i, (u, v) in enumerate(zip(x, y, strict=False)) if u != v), min(len(x), len(y))
        )

    header = shared(plain, ta)  # the template's text before the first message's content
    # Two tagged requests share at most the header and the run's tag prefix, never the
    # message itself, so nothing past the tag can come from a cached prefix.
    assert shared(ta, tb) <= header + 8 < len(plain)
    assert a.messages[0]["content"].endswith(p.messages[0]["content"])


def test_cancel_stops_the_run(smollm2: Model) -> None:
    cancel = threading.Event()

    def on_progress(p: object) -> None:
        if getattr(p, "done", 0) >= 1:
            cancel.set()

    r = run_benchmark(
        EmbeddedTarget(smollm2),
        small_workload(),
        BenchConfig(requests=3, max_tokens=6, warmup=0),
        progress=on_progress,
        cancel=cancel,
        model_file=smollm2.gguf,
    ).to_dict()
    assert r["cancelled"] is True
    assert len(r["traces"]["1"]) == 1
    assert r["roofline"] is None


def test_tokenizer_matches_the_loaded_model(smollm2: Model, smollm2_path: Path) -> None:
    tok = Tokenizer(smollm2_path)
    try:
        for text in ("Hello, world!", "naïve café — 漢字", "def f(x):\n    return x * 2\n"):
            assert tok.count(text) == len(
                smollm2.tokenize(text, add_special=False, parse_special=False)
            )
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        assert tok.count_chat(msgs) == len(smollm2.chat_tokens(msgs))
    finally:
        tok.close()


def test_peak_sampler_sees_an_allocation() -> None:
    import psutil

    base = psutil.Process().memory_info().rss
    with PeakSampler(interval_s=0.01) as s:
        buf = np.ones(200 << 17, dtype=np.float64)  # 200 MiB, written so it is resident
        s.sample()
        del buf
    assert s.peak.ram_bytes is not None
    assert s.peak.ram_bytes >= base + (150 << 20)
    assert s.peak.vram_bytes is None


def test_bandwidth_is_plausible() -> None:
    bw = measure_read_bandwidth(64 << 20, repeats=2)
    # Any machine that runs an LLM reads memory faster than 0.5 GB/s and slower than 10 TB/s.
    assert 0.5e9 < bw < 1e13


def test_machine_context_is_json() -> None:
    ctx = machine_context()
    json.dumps(ctx)
    assert ctx["cpu"] and ctx["llama_cpp_python"] and isinstance(ctx["gpus"], list)
