"""The published benchmark run: `candlewick bench` on the embedded engine, on `candlewick serve`
and on llama-cpp-python's server, same model and workloads, then `bench compare`.

    .venv/bin/python benchmarks/bench_runtimes.py [--out docs/bench] [--requests 8]

Writes JSON and PNG per run into --out and prints every command with its table, ready to paste
into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def server(cmd: list[str], port: int, ready: str) -> Iterator[str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    try:
        end = time.monotonic() + 180
        while time.monotonic() < end:
            if proc.poll() is not None:
                raise SystemExit(f"server exited: {' '.join(cmd)}")
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            with contextlib.suppress(OSError, http.client.HTTPException):
                conn.request("GET", ready)
                if conn.getresponse().status == 200:
                    break
            conn.close()
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def bench(args: list[str]) -> None:
    shown = "candlewick " + " ".join(args)
    print(f"\n$ {shown}", flush=True)
    r = subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        cwd=REPO,
        text=True,
        capture_output=True,
        check=False,
    )
    print(r.stdout, flush=True)
    if r.returncode not in (0, 3):
        print(r.stderr, file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "bench")
    ap.add_argument("--requests", default="8")
    ap.add_argument("--max-tokens", default="128")
    ap.add_argument("--skip", action="append", default=[], help="embedded|rag|serve|llama")
    # One thread by default: on a shared, oversubscribed machine two llama.cpp threads stall
    # at every barrier while the other is descheduled, and the numbers become noise.
    ap.add_argument("--threads", default="1")
    a = ap.parse_args()
    out = a.out
    out.mkdir(parents=True, exist_ok=True)
    rel = out.relative_to(REPO) if out.is_relative_to(REPO) else out
    common = ["--requests", a.requests, "--max-tokens", a.max_tokens, "--quiet"]
    threads = ["--threads", a.threads]
    if "embedded" not in a.skip:
        bench(
            [
                "bench",
                "--model",
                "default",
                "--workload",
                "chat",
                "--concurrency",
                "1,2,4",
                "--slo-ttft",
                "1",
                *common,
                *threads,
                "--out",
                f"{rel}/embedded-chat.json",
                "--plot",
                f"{rel}/embedded-chat.png",
            ]
        )
    if "rag" not in a.skip:
        bench(
            [
                "bench",
                "--model",
                "default",
                "--workload",
                "rag",
                "--concurrency",
                "1,2",
                "--slo-ttft",
                "10",
                "--requests",
                "4",
                "--max-tokens",
                a.max_tokens,
                "--quiet",
                *threads,
                "--out",
                f"{rel}/embedded-rag.json",
                "--plot",
                f"{rel}/embedded-rag.png",
            ]
        )
    from app.services.library import bundled_default_model

    model = str(bundled_default_model())
    if "serve" not in a.skip:
        port = free_port()
        with server(
            [
                sys.executable,
                "-m",
                "app.cli",
                "serve",
                "--port",
                str(port),
                "--parallel",
                "4",
                "--ctx",
                "1024",
                *threads,
            ],
            port,
            "/health",
        ) as url:
            # Candlewick names its model "default": give the tokenizer for the model facts.
            bench(
                [
                    "bench",
                    "--url",
                    url,
                    "--tokenizer",
                    "default",
                    "--workload",
                    "chat",
                    "--concurrency",
                    "1,2,4",
                    "--slo-ttft",
                    "1",
                    *common,
                    "--out",
                    f"{rel}/serve-chat.json",
                    "--plot",
                    f"{rel}/serve-chat.png",
                ]
            )
    if "llama" not in a.skip:
        port = free_port()
        with server(
            [
                sys.executable,
                str(REPO / "benchmarks" / "llama_cpp_server.py"),
                "--model",
                model,
                "--port",
                str(port),
                "--n_ctx",
                "4096",
                "--n_threads",
                a.threads,
                "--n_threads_batch",
                a.threads,
                # Its default cuts a running answer short when another request arrives.
                "--interrupt_requests",
                "False",
            ],
            port,
            "/v1/models",
        ) as url:
            bench(
                [
                    "bench",
                    "--url",
                    url,
                    "--workload",
                    "chat",
                    "--concurrency",
                    "1,2,4",
                    "--slo-ttft",
                    "1",
                    *common,
                    "--out",
                    f"{rel}/llama-cpp-server-chat.json",
                    "--plot",
                    f"{rel}/llama-cpp-server-chat.png",
                ]
            )
    a_json, b_json = out / "llama-cpp-server-chat.json", out / "serve-chat.json"
    if a_json.exists() and b_json.exists():
        bench(["bench", "compare", f"{rel}/llama-cpp-server-chat.json", f"{rel}/serve-chat.json"])


if __name__ == "__main__":
    main()
