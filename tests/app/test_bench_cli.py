"""`candlewick bench` end to end: embedded engine, llama_cpp.server, `candlewick serve`, failures
and `bench compare`, each through the real command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.app.cli_inproc import run_cli
from tests.engine.clients.bench_servers import (
    FaultServer,
    candlewick_serve,
    free_port,
    llama_cpp_server,
)

FAST = ["--requests", "2", "--max-tokens", "8", "--warmup", "0"]
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
    "requests_per_s",
)


def cli(*args: str, timeout: float = 280) -> subprocess.CompletedProcess[str]:
    """A separate process, for what a run measures of its own process (peak memory, argv);
    the tests of refusals and failures run the same `main` in this process (`run_cli`)."""
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def assert_complete(result: dict[str, object], levels: list[int]) -> None:
    lvs = result["levels"]
    assert isinstance(lvs, list) and [lv["concurrency"] for lv in lvs] == levels
    for lv in lvs:
        assert lv["succeeded"] == lv["requests"], lv["error_samples"]
        for f in LEVEL_FIELDS:
            assert lv[f] is not None, f
    machine = result["machine"]
    assert isinstance(machine, dict) and machine["cpu"] and machine["ram_bytes"]


@pytest.mark.model
def test_embedded_run_json(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    r = cli(
        "bench",
        "--model",
        "default",
        "--concurrency",
        "1",
        "--bandwidth-mib",
        "64",
        "--slo-ttft",
        "30",
        "--out",
        str(out),
        "--json",
        *FAST,
    )
    assert r.returncode == 0, r.stderr
    printed = json.loads(r.stdout)
    assert printed == json.loads(out.read_text())
    assert_complete(printed, [1])
    assert printed["max_concurrency_meeting_slo"] == 1
    assert printed["roofline"]["achieved_pct"] > 0
    assert printed["target"]["quantization"] and printed["target"]["n_ctx"] >= 256
    assert printed["command"][:2] == ["candlewick", "bench"]
    assert r.stderr == ""  # --json: no progress bar


@pytest.mark.model
def test_embedded_concurrency_runs_through_the_scheduler() -> None:
    r = cli("bench", "--concurrency", "1,2", "--no-bandwidth", "--threads", "1", *FAST)
    assert r.returncode == 0, r.stderr
    assert "continuous batching" in r.stdout
    rows = [line for line in r.stdout.splitlines() if line.startswith("|    ")]
    assert [row.split("|")[2].strip() for row in rows] == ["2/2", "2/2"]
    # stderr is not a terminal here: one progress line per finished level.
    assert "level 2/2  concurrency   2  [########################] 2/2  failed 0" in r.stderr


def test_ctrl_c_stops_cleanly() -> None:
    import signal
    import time

    with FaultServer("stall") as srv:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "app.cli",
                "bench",
                "--url",
                srv.url,
                "--no-bandwidth",
                "--concurrency",
                "2",
                *FAST,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # A shell that starts jobs in the background (no job control)
            # makes them ignore SIGINT, and children inherit that; Python
            # then never turns Ctrl+C into KeyboardInterrupt.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        while len(srv.requests) < 2 and proc.poll() is None:  # both requests in flight
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        try:
            _out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _out, err = proc.communicate()
            pytest.fail(f"bench did not stop within 30 s of Ctrl+C; stderr: {err[-2000:]!r}")
    assert proc.returncode == 130
    assert "candlewick: interrupted" in err
    assert "Traceback" not in err


def test_unreachable_url_is_reported_as_failures(tmp_path: Path) -> None:
    out = tmp_path / "dead.json"
    r = run_cli(
        "bench",
        "--url",
        f"http://127.0.0.1:{free_port()}",
        "--concurrency",
        "1,2",
        "--no-bandwidth",
        "--out",
        str(out),
        *FAST,
    )
    assert r.returncode == 3
    assert "Traceback" not in r.stderr
    assert "0/2" in r.stdout and "connection refused" in r.stdout
    result = json.loads(out.read_text())
    assert [lv["failure_rate"] for lv in result["levels"]] == [1.0, 1.0]


def test_server_errors_are_reported_as_failures(tmp_path: Path) -> None:
    with FaultServer("http500") as srv:
        r = run_cli("bench", "--url", srv.url, "--concurrency", "2", "--no-bandwidth", *FAST)
    assert r.returncode == 3
    assert "Traceback" not in r.stderr
    assert "HTTP 500: model crashed" in r.stdout
    assert len(srv.requests) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workload", "nope"], "no workload 'nope'"),
        (["--url", "localhost:8080"], "not an http(s) URL"),
        (["--model", "no-such-model"], "no model called 'no-such-model'"),
        (["--concurrency", "0"], "levels must be whole numbers"),
        (["--concurrency", "a,b"], "not a comma-separated list"),
        (["--slo-ttft", "-1"], "must be greater than 0"),
        (["--model", "default", "--url", "http://x"], "not allowed with argument"),
    ],
)
def test_bad_input_is_one_line(args: list[str], message: str) -> None:
    r = run_cli("bench", *args)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_compare_bad_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}', encoding="utf-8")
    r = run_cli("bench", "compare", str(bad), str(other))
    assert r.returncode == 2 and "is not JSON" in r.stderr
    r = run_cli("bench", "compare", str(other), str(other))
    assert r.returncode == 2 and "not a Candlewick benchmark result" in r.stderr
    r = run_cli("bench", "compare", str(tmp_path / "missing.json"), str(other))
    assert r.returncode == 2 and "no such file" in r.stderr


@pytest.fixture(scope="module")
def llama_result(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path
) -> tuple[Path, int, subprocess.CompletedProcess[str]]:
    tmp = tmp_path_factory.mktemp("bench-llama")
    out = tmp / "llama.json"
    # Queue concurrent requests instead of cutting running answers short (its default).
    with llama_cpp_server(smollm2_path, tmp / "llama.log", interrupt=False) as (url, pid):
        r = cli(
            "bench",
            "--url",
            url,
            "--concurrency",
            "1,2",
            "--bandwidth-mib",
            "64",
            "--out",
            str(out),
            "--plot",
            str(tmp / "llama.png"),
            *FAST,
        )
    return out, pid, r


@pytest.fixture(scope="module")
def serve_result(
    tmp_path_factory: pytest.TempPathFactory,
    smollm2_path: Path,  # what the child serves: its tests are marked `model`
) -> tuple[Path, int, subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    tmp = tmp_path_factory.mktemp("bench-serve")
    out = tmp / "candlewick.json"
    key = "bench-test-key-0123456789"
    with candlewick_serve(tmp / "serve.log", parallel=2, api_key=key) as (url, pid):
        r = cli(
            "bench",
            "--url",
            url,
            "--api-key",
            key,
            "--concurrency",
            "1,2",
            "--no-bandwidth",
            "--out",
            str(out),
            *FAST,
        )
        r_key = cli(
            "bench",
            "--url",
            url,
            "--api-key",
            "wrong",
            "--concurrency",
            "1",
            "--no-bandwidth",
            *FAST,
        )
    return out, pid, r, r_key


def test_llama_cpp_server(llama_result: tuple[Path, int, subprocess.CompletedProcess[str]]) -> None:
    out, pid, r = llama_result
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert_complete(res, [1, 2])
    assert res["target"]["server_pid"] == pid  # found from the listening port
    # llama_cpp.server sends no usage: the model file it names is tokenised instead.
    assert {t["token_source"] for t in res["traces"]["1"]} == {"tokenizer"}
    assert res["target"]["quantization"]  # known through that file too
    assert res["roofline"]["limit_tps"] > 0
    assert (out.parent / "llama.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_candlewick_serve(
    serve_result: tuple[
        Path, int, subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]
    ],
) -> None:
    out, pid, r, r_key = serve_result
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert_complete(res, [1, 2])
    assert res["target"]["server_pid"] == pid
    # Candlewick reports usage in the stream: the server's own counts are used.
    assert {t["token_source"] for t in res["traces"]["2"]} == {"usage"}
    # A wrong key: every request fails with the server's 401, reported, not a crash.
    assert r_key.returncode == 3 and "HTTP 401" in r_key.stdout
    assert "Traceback" not in r_key.stderr


def test_compare_two_runtimes(
    llama_result: tuple[Path, int, subprocess.CompletedProcess[str]],
    serve_result: tuple[
        Path, int, subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]
    ],
) -> None:
    a, b = llama_result[0], serve_result[0]
    ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
    r = cli("bench", "compare", str(a), str(b), "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert {row["concurrency"] for row in rows} == {1, 2}
    ttft = next(row for row in rows if row["metric"] == "ttft_p50" and row["concurrency"] == 1)
    assert ttft["ratio"] == pytest.approx(rb["levels"][0]["ttft_p50"] / ra["levels"][0]["ttft_p50"])
    r = cli("bench", "compare", str(a), str(b))
    assert r.returncode == 0 and "B/A" in r.stdout and "ttft_p50" in r.stdout
