"""benchmarks/serving_defaults.py without a model: which prompts and seeds each round sends,
the order of the servers, the figures and the table from given replies, a server that does
not come up, and one whole measurement over the real server routes on a fake model
(tests/fake_server_engine.py), so what reaches the server is what the issue describes."""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks import serving_defaults as sd
from benchmarks.doc_tables import replace_between
from engine.server import ServerConfig, ServerThread
from tests.fake_server_engine import FakeModel, fake_model, serve_fake


def reply(n: int, sent: float, first: float, done: float, tokens: int, **kw: object) -> sd.Reply:
    base: dict[str, Any] = {"prompt_tokens": 37, "cached_tokens": 0}
    base.update(kw)
    return sd.Reply(n, sent, first, done, tokens, **base)


def round_of(
    ttft_s: float, single_wall: float, burst_wall: float, cached: int, *, llama: bool = False
) -> sd.Round:
    """A round whose single request streams 96 tokens and whose burst of 2 streams 96 each.
    The time inside the server: llama-server's prefill in `timings`, Candlewick's /metrics."""
    timings = (
        {"cache_n": cached, "prompt_n": 37 - cached, "prompt_ms": ttft_s * 250} if llama else None
    )
    single = reply(0, 0.0, ttft_s, single_wall, 96, cached_tokens=cached, timings=timings)
    burst = [
        reply(1, 10.0, 10.1, 10.0 + burst_wall / 2, 96),
        reply(2, 10.0, 10.1, 10.0 + burst_wall, 96),
    ]
    return sd.Round(single, burst, server_ttft_s=None if llama else ttft_s / 2)


# -- what each round sends ------------------------------------------------------------------


def test_single_prompt_repeats_and_the_bursts_are_new_every_round() -> None:
    bursts = [sd.burst_ns(r, 8) for r in range(5)]
    seen = [n for b in bursts for n in b]
    assert all(len(b) == 8 for b in bursts)
    assert len(set(seen)) == len(seen), "a burst prompt came back in another round"
    assert sd.SINGLE_N not in seen
    assert all(n < sd.WARM_UP_N for n in seen), "a measured prompt was warmed up"
    assert sd.prompt(3) == (
        "[3] Write a long story about a lighthouse keeper who finds a message in a bottle."
    )


def test_seeds_differ_per_request_and_match_across_servers() -> None:
    seeds = [sd.seed(r, i) for r in range(5) for i in range(9)]
    assert len(set(seeds)) == len(seeds)
    assert sd.seed(2, 3) == sd.seed(2, 3)  # a pure function: both servers get the same


def test_rounds_alternate_abba() -> None:
    order = [name for r in range(4) for name in sd.alternate(["a", "b"], r)]
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]


# -- figures and the table ------------------------------------------------------------------


@pytest.fixture
def summary() -> dict[str, Any]:
    ours = [
        round_of(0.060, 1.0, 2.0, 0),
        round_of(0.062, 0.9, 1.6, 0),
        round_of(0.070, 0.96, 2.4, 0),
    ]
    theirs = [
        round_of(0.025, 0.8, 1.2, 36, llama=True),
        round_of(0.031, 0.8, 1.0, 36, llama=True),
        round_of(0.027, 1.0, 1.6, 36, llama=True),
    ]
    return sd.summarize({sd.CANDLEWICK: ours, sd.LLAMA_SERVER: theirs})


def test_medians_spreads_and_paired_ratios(summary: dict[str, Any]) -> None:
    ours = summary[sd.CANDLEWICK]
    assert ours["ttft_ms"] == {
        "median": 62.0,
        "min": 60.0,
        "max": 70.0,
        "values": [60.0, 62.0, 70.0],
    }
    assert ours["tps_1"]["median"] == 100.0
    assert ours["tps_burst"]["values"] == [96.0, 120.0, 80.0]
    ratios = summary["ratios"]
    assert ratios["ttft_ms"]["of_medians"] == pytest.approx(62 / 27, abs=1e-3)
    # per round: 60/25, 62/31, 70/27
    assert ratios["ttft_ms"]["per_round"]["min"] == 2.0
    assert ratios["ttft_ms"]["per_round"]["max"] == pytest.approx(70 / 27, abs=1e-3)
    assert "lower" in ratios["better"]["ttft_ms"]
    assert "higher" in ratios["better"]["tps_burst"]


def test_cached_tokens_recorded_per_request(summary: dict[str, Any]) -> None:
    theirs = summary[sd.LLAMA_SERVER]["cache"]
    assert [s["cached"] for s in theirs["single"]] == [36, 36, 36]
    assert theirs["burst_cached"] == [[0, 0]] * 3
    assert theirs["single_server_ttft_ms"] == [None, None, None]
    assert theirs["single"][0]["timings"] == {"cache_n": 36, "prompt_n": 1, "prompt_ms": 6.25}


def test_table_names_each_figure_its_direction_and_the_command(summary: dict[str, Any]) -> None:
    text = sd.table(summary, 8, "CMD", {"candlewick": "0.1.0", "openai": "1"})
    assert text.startswith("`CMD`")
    ttft = "| TTFT, one request, ms (lower is better) | 27.0 (25.0-31.0) | 62.0 (60.0-70.0) |"
    assert f"{ttft} 2.30 (2.00-2.59) |" in text
    assert "tokens/s, 8 concurrent (higher is better)" in text
    assert "| 36 of 37 | 0 of 37 |" in text
    assert "Candlewick: arrival to first text, /metrics) | 6.8 | 31.0 | |" in text
    assert "Versions: candlewick 0.1.0, openai 1." in text


def test_the_doc_section_is_replaced_between_its_markers(
    tmp_path: Path, summary: dict[str, Any]
) -> None:
    page = tmp_path / "benchmarks.md"
    page.write_text(f"# B\n\nbefore\n\n{sd.START}\nnot yet measured\n{sd.END}\n\nafter\n")
    text = sd.table(summary, 8, "CMD", {"candlewick": "0.1.0"})
    replace_between(page, sd.START, sd.END, text)
    out = page.read_text()
    assert "not yet measured" not in out
    assert out.startswith("# B\n\nbefore\n\n") and out.endswith("\n\nafter\n")
    assert "Measured on:" in out


def test_shown_command_carries_no_machine_paths() -> None:
    argv = ["--llama-server", "/opt/x/llama-server", "--rounds", "5", "--model", "/m/a.gguf"]
    shown = sd.shown_command([*argv, "--write", "docs/benchmarks.md"])
    assert shown == (
        ".venv/bin/python benchmarks/serving_defaults.py --llama-server PATH/llama-server "
        "--rounds 5 --model a.gguf"
    )


def test_server_commands_give_each_only_the_shape() -> None:
    ours, theirs = sd.commands(Path("m.gguf"), "ls", threads=2, slots=8, ctx=4096)
    assert ours.argv[1:] == [
        *("serve", "--model", "m.gguf", "--parallel", "8", "--ctx", "4096"),
        *("--threads", "2", "--port", str(ours.port)),
    ]
    assert theirs.argv == [
        *("ls", "-m", "m.gguf", "-np", "8", "-c", "32768", "-t", "2"),
        *("--port", str(theirs.port)),
    ]
    assert ours.port != theirs.port


# -- a server that does not come up ---------------------------------------------------------


def test_a_server_that_exits_is_one_line_with_its_last_output(tmp_path: Path) -> None:
    code = "import sys; print('loading'); sys.stderr.write('a\\nb\\nno such model\\n'); sys.exit(3)"
    cmd = sd.ServerCommand("llama-server", [sys.executable, "-c", code], sd.free_port())
    with pytest.raises(sd.BenchError) as err, sd.running(cmd, tmp_path, timeout=120):
        pass
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("llama-server did not come up: exited with 3: ")
    assert msg.endswith("no such model")


def test_a_server_that_stays_down_is_stopped(tmp_path: Path) -> None:
    # Whether the child printed yet depends on the machine's load: the reason's start does not.
    code = "import time; print('still loading', flush=True); time.sleep(600)"
    cmd = sd.ServerCommand("candlewick", [sys.executable, "-c", code], sd.free_port())
    with (
        pytest.raises(sd.BenchError, match=r"^candlewick did not come up in 1 s: "),
        sd.running(cmd, tmp_path, timeout=1),
    ):
        pass


# -- one whole measurement over the real routes ---------------------------------------------


@pytest.fixture
def fake_server(tmp_path: Path) -> Iterator[tuple[FakeModel, ServerThread]]:
    with (
        fake_model(tmp_path) as model,
        serve_fake(model, ServerConfig(port=0, model_id="fake")) as srv,
    ):
        yield model, srv


def test_a_measurement_sends_what_the_issue_describes(
    fake_server: tuple[FakeModel, ServerThread],
) -> None:
    model, srv = fake_server
    plan = sd.Plan(rounds=2, slots=2, max_tokens=12)
    eps = [sd.Endpoint("candlewick", srv.url, "fake"), sd.Endpoint("llama-server", srv.url, "fake")]
    by_server = asyncio.run(sd.measure(eps, plan))
    assert model.loop.wait_idle(10)

    # Each endpoint's warm-up (the single prompt, then a burst never measured), then per round
    # the single prompt and a new burst; round 0 is A B, round 1 is B A (one server here).
    prompts = [int(re.findall(r"\[(\d+)\]", s.prompt)[0]) for s in model.seen]
    calls = [(p[0], sorted(p[1:])) for p in (prompts[i : i + 3] for i in range(0, 18, 3))]
    warm = (sd.SINGLE_N, [sd.WARM_UP_N, sd.WARM_UP_N + 1])
    r0, r1 = (sd.SINGLE_N, sd.burst_ns(0, 2)), (sd.SINGLE_N, sd.burst_ns(1, 2))
    assert calls == [warm, warm, r0, r0, r1, r1]
    for s in model.seen:
        assert s.stream
        assert s.sampling.temperature == pytest.approx(sd.TEMPERATURE)
        assert s.sampling.max_tokens == 12
        assert s.sampling.seed is not None and s.sampling.seed >= 0

    for rounds in by_server.values():
        assert len(rounds) == 2
        for rnd in rounds:
            assert rnd.ttft_ms > 0 and rnd.tps_1 > 0 and rnd.tps_burst > 0
            assert rnd.single.completion_tokens > 0
            assert rnd.single.cached_tokens is not None  # usage.prompt_tokens_details
            assert rnd.server_ttft_s is not None  # Candlewick's /metrics
            assert len(rnd.burst) == 2
    summary = sd.summarize(by_server)
    assert summary["ratios"]["tps_1"]["per_round"]["min"] > 0


def test_a_refused_request_stops_the_run_with_one_line(
    fake_server: tuple[FakeModel, ServerThread],
) -> None:
    _, srv = fake_server
    eps = [sd.Endpoint("candlewick", srv.url, "no-such-model")]
    with pytest.raises(sd.BenchError, match=r"^candlewick: a request failed: NotFoundError: ") as e:
        asyncio.run(sd.measure(eps, sd.Plan(rounds=1, slots=2, max_tokens=4)))
    assert "\n" not in str(e.value)
