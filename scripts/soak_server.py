"""Soak and fault run of `candlewick serve`: many mixed requests at once, then a kill mid-stream.

    .venv/bin/python scripts/soak_server.py [--requests 300] [--concurrency 16] [--parallel 4]

Starts `candlewick serve` on the bundled model as a child process (a private profile, a free
port on 127.0.0.1) and sends `--requests` requests, `--concurrency` at a time, with httpx: a
seeded mix of streamed and whole chat completions (short answers), malformed ones (bad JSON,
wrong types, an unknown model: each must get a 4xx) and client-dropped ones (a stream closed
after its first chunk, a whole answer abandoned while it is written). Then it checks:

- no 5xx and no broken connection, by the client's count and by the server's own `/metrics`;
- every well-formed request answered with content;
- `/slots` shows no busy slot and `/health` an empty queue once the run is over;
- the server's RSS at start, after a warm-up and at the end: the end within `--rss-slack-mib`
  of the warm-up;
- nothing in the server's log looks like a traceback.

Then it SIGKILLs the server while a stream is being read, checks that the client of that stream
got a connection error (not a hang), restarts the server on the same profile and port and checks
that it answers. Exit status 0 when every check passed, 1 otherwise; the whole run is bounded by
`--time-limit`. Only loopback addresses are used.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.bench.hw import cpu_name  # noqa: E402

HOST = "127.0.0.1"
CHAT_ROUTE = "/v1/chat/completions"
MiB = 1024 * 1024

# The mix of a run, by weight.
KINDS = {"stream": 35, "whole": 30, "malformed": 20, "dropped": 15}
# Prompts whose answers cannot be empty: the check is that every well-formed request gets text.
PROMPTS = (
    "Count from 1 to 20, separated by commas.",
    "Name three colours of the rainbow.",
    "Write one sentence about a lighthouse.",
    "List the days of the week.",
    "What is 12 plus 30? Answer with a sentence.",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def candlewick_command() -> list[str]:
    """The installed `candlewick` next to this interpreter, or the package run as a module."""
    exe = Path(sys.executable).with_name("candlewick")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "app.cli"]


class Serve:
    """`candlewick serve` as a child process on a given profile (CANDLEWICK_HOME) and port."""

    def __init__(
        self, home: Path, port: int, *, parallel: int, ctx: int, threads: int | None
    ) -> None:
        self.home, self.port = home, port
        self.args = ["--parallel", str(parallel), "--ctx", str(ctx), "--no-embeddings"]
        if threads:
            self.args += ["--threads", str(threads)]
        self.log = home / "serve.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 180.0) -> float:
        """Start the server and wait for /health; the seconds it took."""
        t0 = time.monotonic()
        env = dict(os.environ, CANDLEWICK_HOME=str(self.home))
        cmd = [*candlewick_command(), "serve", "--host", HOST, "--port", str(self.port)]
        self.starts += 1
        with self.log.open("ab") as out:
            out.write(f"--- start {self.starts}: {' '.join(cmd + self.args)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                cmd + self.args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env
            )
        end = t0 + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited with {self.proc.returncode}: {self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return time.monotonic() - t0
            time.sleep(0.2)
        raise RuntimeError(f"serve did not answer /health within {timeout:.0f} s")

    def rss(self) -> int:
        return int(psutil.Process(self.pid).memory_info().rss)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        """Ctrl+C, as a person stops it; a kill when it does not end in time."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass(frozen=True)
class Job:
    index: int
    kind: str  # a key of KINDS
    variant: str  # what exactly: the malformation, the way the client drops
    prompt: str


@dataclass
class Outcome:
    job: Job
    status: int | None = None  # None: no HTTP status (a connection error, a drop)
    text: str = ""
    error: str = ""  # what went wrong, for a failed check

    @property
    def status_class(self) -> str:
        if self.status is None:
            return "dropped" if self.job.kind == "dropped" and not self.error else "no answer"
        return f"{self.status // 100}xx"


MALFORMED = ("bad-json", "wrong-type", "messages-not-list", "unknown-model", "empty-messages")
DROPS = ("close-after-first-chunk", "abandon-whole")


def plan(n: int, seed: int) -> list[Job]:
    """`n` requests in a seeded, shuffled mix of the kinds."""
    rng = random.Random(seed)
    kinds = rng.choices(list(KINDS), weights=list(KINDS.values()), k=n)
    jobs = []
    for i, kind in enumerate(kinds):
        variant = {"malformed": MALFORMED, "dropped": DROPS}.get(kind, (kind,))
        jobs.append(Job(i, kind, rng.choice(variant), f"[{i}] {rng.choice(PROMPTS)}"))
    return jobs


def _body(job: Job, max_tokens: int, stream: bool) -> dict[str, Any]:
    return {
        "model": "default",
        "messages": [{"role": "user", "content": job.prompt}],
        "max_tokens": max_tokens,
        "stream": stream,
        "seed": job.index,
    }


async def _read_stream(r: httpx.Response, *, first_only: bool = False) -> tuple[str, bool]:
    """The streamed text and whether the stream ended with [DONE]; raises on an error event."""
    text = ""
    async for line in r.aiter_lines():
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            return text, True
        event = json.loads(data)
        if "error" in event:
            raise RuntimeError(f"error event in the stream: {event['error']}")
        for choice in event.get("choices", []):
            text += choice.get("delta", {}).get("content") or ""
        if first_only and text:
            return text, False
    return text, False


async def send(client: httpx.AsyncClient, job: Job, max_tokens: int) -> Outcome:
    out = Outcome(job)
    url = CHAT_ROUTE
    try:
        if job.kind == "stream" or job.variant == "close-after-first-chunk":
            dropping = job.kind == "dropped"
            async with client.stream("POST", url, json=_body(job, max_tokens, True)) as r:
                out.status = r.status_code
                if r.status_code != 200:
                    out.error = (await r.aread()).decode(errors="replace")[:200]
                    return out
                out.text, done = await _read_stream(r, first_only=dropping)
                if dropping:
                    out.status = None  # leaving the block closes the connection mid-stream
                elif not done:
                    out.error = "the stream ended without [DONE]"
        elif job.kind == "whole":
            r = await client.post(url, json=_body(job, max_tokens, False))
            out.status = r.status_code
            if r.status_code == 200:
                out.text = r.json()["choices"][0]["message"]["content"] or ""
            else:
                out.error = r.text[:200]
        elif job.variant == "abandon-whole":
            # Gone before the answer is written: the server must not keep the slot busy.
            with contextlib.suppress(TimeoutError):
                r = await asyncio.wait_for(
                    client.post(url, json=_body(job, max_tokens * 4, False)), timeout=0.3
                )
                out.status = r.status_code  # it was faster than the client's patience
        else:
            out.status, out.error = await _malformed(client, job)
    except (httpx.HTTPError, RuntimeError, ValueError, KeyError) as e:
        out.error = f"{type(e).__name__}: {e}"
    return out


async def _malformed(client: httpx.AsyncClient, job: Job) -> tuple[int, str]:
    """A request the server must refuse with a 4xx and a one-line JSON error."""
    url = CHAT_ROUTE
    body: dict[str, Any] = _body(job, 16, False)
    if job.variant == "bad-json":
        r = await client.post(
            url, content=b'{"messages": [{"role": "user", "content": "Hi"', headers=_JSON
        )
    else:
        if job.variant == "wrong-type":
            body["max_tokens"] = "sixteen"
        elif job.variant == "messages-not-list":
            body["messages"] = "Hi"
        elif job.variant == "unknown-model":
            body["model"] = "no-such-model-anywhere"
        elif job.variant == "empty-messages":
            body["messages"] = []
        r = await client.post(url, json=body)
    problem = ""
    if 400 <= r.status_code < 500:
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            problem = f"a {r.status_code} without a JSON error: {r.text[:120]}"
        else:
            if not message or "\n" in message:
                problem = f"the error is not one line: {message!r}"
    else:
        problem = f"expected a 4xx for {job.variant}, got {r.status_code}: {r.text[:120]}"
    return r.status_code, problem


_JSON = {"Content-Type": "application/json"}


@dataclass
class Report:
    outcomes: list[Outcome] = field(default_factory=list)
    rss: dict[str, int] = field(default_factory=dict)  # start, warm-up, end
    slots_after: dict[str, Any] = field(default_factory=dict)
    server_statuses: dict[str, int] = field(default_factory=dict)  # the server's own count
    seconds: float = 0.0
    kill: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    # The machine's 1-minute load average when the soak started and ended (a shared machine
    # slows every figure down; the checks do not depend on it).
    load: dict[str, float] = field(default_factory=dict)

    def by_class(self) -> dict[str, int]:
        return dict(sorted(Counter(o.status_class for o in self.outcomes).items()))

    def by_kind(self) -> dict[str, int]:
        return dict(sorted(Counter(o.job.kind for o in self.outcomes).items()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": len(self.outcomes),
            "by_kind": self.by_kind(),
            "by_status_class": self.by_class(),
            "server_statuses": self.server_statuses,
            "rss_mib": {k: round(v / MiB, 1) for k, v in self.rss.items()},
            "slots_after": self.slots_after,
            "seconds": round(self.seconds, 1),
            "kill": self.kill,
            "load_average": self.load,
            "cpu": f"{cpu_name()}, {os.cpu_count()} cores",
            "failures": self.failures,
        }


def check(outcomes: list[Outcome]) -> list[str]:
    """What went wrong among the outcomes, one line each."""
    failures = []
    for o in outcomes:
        j = o.job
        if o.status is not None and o.status >= 500:
            failures.append(f"#{j.index} {j.kind}/{j.variant}: HTTP {o.status}: {o.error}")
        elif j.kind in ("stream", "whole") and (o.status != 200 or not o.text.strip() or o.error):
            failures.append(
                f"#{j.index} {j.kind}: not answered with content "
                f"(status {o.status}, {len(o.text)} characters, {o.error or 'no error'})"
            )
        elif j.kind in ("malformed", "dropped") and o.error:
            failures.append(f"#{j.index} {j.kind}/{j.variant}: {o.error}")
    return failures


async def _drain(
    client: httpx.AsyncClient, jobs: list[Job], concurrency: int, max_tokens: int
) -> list[Outcome]:
    queue: asyncio.Queue[Job] = asyncio.Queue()
    for j in jobs:
        queue.put_nowait(j)
    results: list[Outcome] = []

    async def worker() -> None:
        while True:
            try:
                job = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            results.append(await send(client, job, max_tokens))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return sorted(results, key=lambda o: o.job.index)


async def wait_idle(client: httpx.AsyncClient, timeout: float = 60.0) -> dict[str, Any]:
    """The busy slots (/slots, in llama-server's list shape) and the queue (/health) once no
    slot is busy and nothing is queued (or the last look at `timeout`)."""
    end = time.monotonic() + timeout
    while True:
        slots: list[dict[str, Any]] = (await client.get("/slots")).json()
        busy = [s["id"] for s in slots if s["is_processing"]]
        queued = int((await client.get("/health")).json().get("queue_depth") or 0)
        seen = {"busy_slots": busy, "queue_depth": queued}
        if (not busy and not queued) or time.monotonic() > end:
            return seen
        await asyncio.sleep(0.2)


async def server_statuses(client: httpx.AsyncClient) -> dict[str, int]:
    """The server's own count of the soak's requests by status code (its /metrics)."""
    text = (await client.get("/metrics")).text
    counts: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name != "candlewick_requests":
            continue
        for sample in family.samples:
            # The soak's own route only: /health (503 while the model loads), /slots and
            # /metrics are the checks' polls.
            if sample.name.endswith("_total") and sample.labels["route"] == CHAT_ROUTE:
                counts[sample.labels["status"]] += int(sample.value)
    return dict(sorted(counts.items()))


def _client(url: str, concurrency: int, read_timeout: float) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=url,
        timeout=httpx.Timeout(read_timeout, connect=10.0),
        limits=httpx.Limits(max_connections=concurrency + 4),
    )


async def soak(
    serve: Serve,
    jobs: list[Job],
    *,
    concurrency: int,
    max_tokens: int,
    warmup: int,
    read_timeout: float = 600.0,
) -> Report:
    """The mixed run against a started server (the RSS figures and checks in the report)."""
    report = Report()
    report.load["start"] = round(os.getloadavg()[0], 1)
    t0 = time.monotonic()
    async with _client(serve.url, concurrency, read_timeout) as client:
        report.rss["start"] = serve.rss()
        head, rest = jobs[:warmup], jobs[warmup:]
        report.outcomes += await _drain(client, head, concurrency, max_tokens)
        await wait_idle(client)
        report.rss["warm-up"] = serve.rss()
        report.outcomes += await _drain(client, rest, concurrency, max_tokens)
        report.slots_after = await wait_idle(client)
        report.rss["end"] = serve.rss()
        report.server_statuses = await server_statuses(client)
    report.seconds = time.monotonic() - t0
    report.load["end"] = round(os.getloadavg()[0], 1)
    report.failures += check(report.outcomes)
    if report.slots_after["busy_slots"] or report.slots_after["queue_depth"]:
        report.failures.append(f"slots still busy after the run: {report.slots_after}")
    bad = {k: v for k, v in report.server_statuses.items() if k.startswith("5")}
    if bad:
        report.failures.append(f"the server counted 5xx answers: {bad}")
    return report


async def kill_mid_stream(serve: Serve, max_tokens: int = 400) -> dict[str, Any]:
    """SIGKILL the server while a stream is read; the client must see a connection error
    within its read timeout (30 s), not wait forever. Returns what happened."""
    seen: dict[str, Any] = {}
    job = Job(-1, "stream", "kill", "Write a long story about a lighthouse keeper.")
    async with (
        httpx.AsyncClient(base_url=serve.url, timeout=httpx.Timeout(30.0, connect=10.0)) as client,
        client.stream("POST", CHAT_ROUTE, json=_body(job, max_tokens, True)) as r,
    ):
        seen["status"] = r.status_code
        lines = r.aiter_lines()
        try:
            async for line in lines:
                if line.startswith("data: ") and '"content"' in line:
                    break  # streaming for real: now kill it
            serve.kill()
            seen["killed_with"] = "SIGKILL"
            async for line in lines:
                if line == "data: [DONE]":
                    seen["client_saw"] = "the stream finished ([DONE]) after the kill"
                    break
            else:
                seen["client_saw"] = "the stream ended without [DONE]"
        except httpx.TimeoutException as e:
            seen["client_saw"] = f"a hang until the read timeout ({type(e).__name__})"
        except httpx.HTTPError as e:
            seen["client_saw"] = f"a connection error ({type(e).__name__})"
    return seen


def kill_and_restart(serve: Serve) -> dict[str, Any]:
    seen = asyncio.run(kill_mid_stream(serve))
    seen["restart_s"] = round(serve.start(), 1)
    r = httpx.post(
        serve.url + CHAT_ROUTE,
        json={"messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 16},
        timeout=120,
    )
    seen["after_restart"] = r.status_code
    seen["after_restart_text"] = (
        r.json()["choices"][0]["message"]["content"] if r.is_success else ""
    )
    return seen


def kill_failures(seen: dict[str, Any]) -> list[str]:
    failures = []
    if seen.get("killed_with") != "SIGKILL":
        failures.append(f"the stream to kill never started: {seen}")
    elif not str(seen.get("client_saw", "")).startswith(("a connection error", "the stream ended")):
        failures.append(f"the client of the killed stream saw {seen.get('client_saw')}")
    if seen.get("after_restart") != 200 or not seen.get("after_restart_text", "").strip():
        failures.append(f"the restarted server did not answer: {seen}")
    return failures


def traceback_lines(log: Path) -> list[str]:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if "Traceback" in line]


@contextlib.contextmanager
def profile(keep: Path | None) -> Iterator[Path]:
    """A private CANDLEWICK_HOME (so the run leaves the user's own profile alone)."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    home = Path(tempfile.mkdtemp(prefix="candlewick-soak-"))
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


def run(args: argparse.Namespace) -> Report:
    """The whole run: start, soak, kill and restart, stop. Failures are in the report."""
    report = Report()
    with profile(args.home) as home:
        serve = Serve(
            home,
            args.port or free_port(),
            parallel=args.parallel,
            ctx=args.ctx,
            threads=args.threads,
        )
        try:
            serve.start()
            jobs = plan(args.requests, args.seed)
            warmup = min(len(jobs) // 5, 4 * args.concurrency)
            run = soak(
                serve,
                jobs,
                concurrency=args.concurrency,
                max_tokens=args.max_tokens,
                warmup=warmup,
                read_timeout=args.read_timeout,
            )
            report = asyncio.run(asyncio.wait_for(run, timeout=args.time_limit))
            report.failures += rss_failures(report.rss, args.rss_slack_mib)
            if not args.no_kill:
                report.kill = kill_and_restart(serve)
                report.failures += kill_failures(report.kill)
        except (RuntimeError, TimeoutError, httpx.HTTPError, psutil.Error) as e:
            report.failures.append(f"the run stopped: {type(e).__name__}: {e}")
        finally:
            serve.stop()
        report.failures += [f"server log: {line}" for line in traceback_lines(serve.log)]
        if report.failures:
            print(serve.log_tail(), file=sys.stderr)
        return report


def rss_failures(rss: dict[str, int], slack_mib: int) -> list[str]:
    """Memory is flat when the end is within `slack_mib` of the warm-up."""
    if rss["end"] <= rss["warm-up"] + slack_mib * MiB:
        return []
    return [
        f"RSS grew from {rss['warm-up'] / MiB:.1f} MiB after the warm-up to "
        f"{rss['end'] / MiB:.1f} MiB (more than {slack_mib} MiB)"
    ]


def print_report(report: Report, args: argparse.Namespace) -> None:
    d = report.to_dict()
    print(f"requests: {d['requests']} at concurrency {args.concurrency}, {d['seconds']} s")
    print(f"  on {d['cpu']}, load average {d['load_average']}")
    print(f"  by kind: {d['by_kind']}")
    print(f"  by status class (client): {d['by_status_class']}")
    print(f"  by status (server /metrics): {d['server_statuses']}")
    print(f"  slots after the run: {d['slots_after']}")
    print(f"  server RSS (MiB): {d['rss_mib']}")
    if d["kill"]:
        print(f"  SIGKILL mid-stream: {d['kill']}")
    for f in report.failures:
        print(f"FAILED: {f}")
    print("ok" if not report.failures else f"{len(report.failures)} check(s) failed")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--parallel", type=int, default=4, help="the server's slots")
    ap.add_argument("--ctx", type=int, default=1024, help="the server's context per slot")
    ap.add_argument("--threads", type=int, default=None, help="the server's decode threads")
    ap.add_argument("--max-tokens", type=int, default=16, help="the answers' length")
    ap.add_argument("--port", type=int, default=0, help="on 127.0.0.1 (default: a free one)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--read-timeout",
        type=float,
        default=600.0,
        help="seconds a client waits for the next bytes (a request queued behind 15 others "
        "on a busy 2-core machine waited over 120 s)",
    )
    ap.add_argument("--rss-slack-mib", type=int, default=64)
    ap.add_argument("--time-limit", type=float, default=1800.0, help="seconds for the soak")
    ap.add_argument("--no-kill", action="store_true", help="skip the kill and restart")
    ap.add_argument(
        "--home", type=Path, default=None, help="the profile (default: a temporary one)"
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the report here")
    return ap


def main() -> int:
    args = parser().parse_args()
    report = run(args)
    print_report(report, args)
    if args.json:
        args.json.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
