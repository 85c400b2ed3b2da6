"""Serving at the defaults: `candlewick serve` beside llama-server as a user of each meets it
(issue #37; docs/benchmarks.md, "Serving at the defaults").

    .venv/bin/python benchmarks/serving_defaults.py --llama-server PATH/llama-server
        [--rounds 5] [--model M] [--threads 2] [--slots 8] [--ctx-per-slot 4096]
        [--max-tokens 96] [--engine] [--write docs/benchmarks.md]

The peer is llama-server built from the llama.cpp that llama-cpp-python 0.3.36 vendors:

    pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36   # then unpack it
    cd llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -B build -DLLAMA_CURL=OFF -DGGML_NATIVE=ON
    cmake --build build -j2 --target llama-server

Both servers run at once on their own ports, each at its own defaults but for the shape both
are given: `candlewick serve --parallel SLOTS --ctx CTX --threads T` and llama-server
`-np SLOTS -c SLOTS*CTX -t T` (its context is shared by its slots). The client is the official
`openai` package's AsyncOpenAI, streaming with `include_usage`, temperature 0.7, a seed per
request, `max_tokens` 96. Each round, on one server then the other (A B, B A, A B, ...): one
request whose prompt is the same in every round, then SLOTS concurrent requests whose prompts
are new. So the single request's prompt has been seen before but its slot has since served
other requests: a server that keeps it (llama-server's RAM prompt cache) reads it back.

Figures: time to first token (TTFT: sending to the first delta with content) of the single
request, lower is better; completion tokens (from `usage`) over wall time of the single
request and of the burst (first send to last finish), higher is better. Medians with min-max
per server, and candlewick/llama-server ratios. Where TTFT goes: the prompt tokens each server
read from its cache for every request (`usage.prompt_tokens_details.cached_tokens`,
llama-server's `timings` too), and the server's own arrival-to-first-text time of the single
request (Candlewick's /metrics). `--engine` adds the engine alone against a tight C-API loop
(`benchmarks/host_clients.py decode`), run after both servers have stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
from openai import AsyncOpenAI

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.doc_tables import machine_line, replace_between  # noqa: E402

START = "<!-- serving-defaults-table:start -->"
END = "<!-- serving-defaults-table:end -->"
CANDLEWICK = "candlewick"
LLAMA_SERVER = "llama-server"
PROMPT = "[{n}] Write a long story about a lighthouse keeper who finds a message in a bottle."
SINGLE_N = 0  # the single request's N, the same in every round
WARM_UP_N = 100_000  # the warm-up burst's first N: never one of the measured prompts
TEMPERATURE = 0.7
CANDLEWICK_TTFT_SUM = "candlewick_time_to_first_token_seconds_sum"


class BenchError(Exception):
    """A one-line reason the benchmark cannot run (a server that did not come up...)."""


@dataclass(frozen=True)
class Plan:
    rounds: int = 5
    slots: int = 8  # also the burst's size
    max_tokens: int = 96


def prompt(n: int) -> str:
    return PROMPT.format(n=n)


def burst_ns(round_no: int, size: int) -> list[int]:
    """The burst's N values: new in every round, never the single request's."""
    return [SINGLE_N + 1 + round_no * size + i for i in range(size)]


def seed(round_no: int, i: int) -> int:
    """Request i of a round (0: the single one) has the same seed on both servers."""
    return 1000 * (round_no + 1) + i


def alternate(names: Sequence[str], round_no: int) -> list[str]:
    """A B, then B A, ...: neither server always runs right after the other."""
    return list(names) if round_no % 2 == 0 else list(reversed(names))


# -- one request, one round -------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    name: str
    url: str
    model: str  # the id its /v1/models lists first


@dataclass(frozen=True)
class Reply:
    """One streamed request as the client saw it, and what the server said of its prompt."""

    n: int
    sent: float  # perf_counter seconds
    first: float | None  # the first delta with content
    done: float
    completion_tokens: int
    prompt_tokens: int
    cached_tokens: int | None  # usage.prompt_tokens_details.cached_tokens
    timings: dict[str, Any] | None = None  # llama-server's own (cache_n, prompt_n, prompt_ms)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first is None else self.first - self.sent

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / (self.done - self.sent)


async def ask(client: AsyncOpenAI, model: str, n: int, seed_: int, max_tokens: int) -> Reply:
    sent = time.perf_counter()
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt(n)}],
        stream=True,
        stream_options={"include_usage": True},
        temperature=TEMPERATURE,
        seed=seed_,
        max_tokens=max_tokens,
    )
    first: float | None = None
    usage = None
    timings: dict[str, Any] | None = None
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter()
        if chunk.usage is not None:
            usage = chunk.usage
        extra = chunk.model_extra or {}
        if isinstance(extra.get("timings"), dict):
            timings = extra["timings"]
    done = time.perf_counter()
    if usage is None:
        raise BenchError(f"{client.base_url}: a stream ended without usage (include_usage)")
    details = usage.prompt_tokens_details
    return Reply(
        n=n,
        sent=sent,
        first=first,
        done=done,
        completion_tokens=usage.completion_tokens,
        prompt_tokens=usage.prompt_tokens,
        cached_tokens=None if details is None else details.cached_tokens,
        timings=timings,
    )


@dataclass(frozen=True)
class Round:
    single: Reply
    burst: list[Reply]
    server_ttft_s: float | None  # the server's arrival-to-first-text of the single request

    @property
    def ttft_ms(self) -> float:
        ttft = self.single.ttft_s
        if ttft is None:
            raise BenchError("the single request streamed no content")
        return ttft * 1000

    @property
    def tps_1(self) -> float:
        return self.single.tokens_per_s

    @property
    def tps_burst(self) -> float:
        wall = max(r.done for r in self.burst) - min(r.sent for r in self.burst)
        return sum(r.completion_tokens for r in self.burst) / wall


async def server_ttft_sum(http: httpx.AsyncClient, url: str) -> float | None:
    """Candlewick's /metrics: the sum of its requests' arrival-to-first-text seconds; None
    where the server has no such figure (llama-server without --metrics)."""
    try:
        r = await http.get(url + "/metrics")
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    for line in r.text.splitlines():
        if line.startswith(CANDLEWICK_TTFT_SUM + " "):
            return float(line.split()[1])
    return None


async def burst(
    client: AsyncOpenAI, model: str, ns: Sequence[int], round_no: int, plan: Plan
) -> list[Reply]:
    return list(
        await asyncio.gather(
            *(
                ask(client, model, n, seed(round_no, 1 + i), plan.max_tokens)
                for i, n in enumerate(ns)
            )
        )
    )


async def one_round(
    client: AsyncOpenAI, http: httpx.AsyncClient, ep: Endpoint, round_no: int, plan: Plan
) -> Round:
    before = await server_ttft_sum(http, ep.url)
    single = await ask(client, ep.model, SINGLE_N, seed(round_no, 0), plan.max_tokens)
    after = await server_ttft_sum(http, ep.url)
    server_ttft = None if before is None or after is None else after - before
    replies = await burst(client, ep.model, burst_ns(round_no, plan.slots), round_no, plan)
    return Round(single, replies, server_ttft)


async def warm_up(client: AsyncOpenAI, ep: Endpoint, plan: Plan) -> None:
    """Not counted: the single prompt once (so every counted round finds it seen before)
    and a burst of prompts never measured."""
    await ask(client, ep.model, SINGLE_N, seed(-1, 0), plan.max_tokens)
    ns = [WARM_UP_N + i for i in range(plan.slots)]
    await burst(client, ep.model, ns, -1, plan)


@contextlib.asynccontextmanager
async def refused(name: str) -> AsyncIterator[None]:
    """A failed request stops the run with one line naming the server."""
    try:
        yield
    except (openai.APIError, httpx.HTTPError) as e:
        raise BenchError(f"{name}: a request failed: {type(e).__name__}: {e}") from e


def client_for(ep: Endpoint) -> AsyncOpenAI:
    # No retries: a refused request is an error of the run, not time to hide.
    return AsyncOpenAI(base_url=ep.url + "/v1", api_key="none", max_retries=0, timeout=600)


async def measure(endpoints: Sequence[Endpoint], plan: Plan) -> dict[str, list[Round]]:
    """Every endpoint warmed up, then the rounds, alternating between them."""
    by_name = {ep.name: ep for ep in endpoints}
    clients = {ep.name: client_for(ep) for ep in endpoints}
    out: dict[str, list[Round]] = {ep.name: [] for ep in endpoints}
    async with httpx.AsyncClient(timeout=30) as http:
        try:
            for ep in endpoints:
                async with refused(ep.name):
                    await warm_up(clients[ep.name], ep, plan)
            for r in range(plan.rounds):
                for name in alternate(list(by_name), r):
                    async with refused(name):
                        rnd = await one_round(clients[name], http, by_name[name], r, plan)
                    out[name].append(rnd)
                    print(
                        f"round {r + 1}/{plan.rounds} {name}: TTFT {rnd.ttft_ms:.1f} ms, "
                        f"{rnd.tps_1:.1f} t/s alone, {rnd.tps_burst:.1f} t/s x{plan.slots}",
                        file=sys.stderr,
                    )
        finally:
            for c in clients.values():
                await c.close()
    return out


# -- the servers ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class ServerCommand:
    name: str
    argv: list[str]
    port: int


def commands(
    model: Path,
    llama_server: str,
    threads: int,
    slots: int,
    ctx: int,
    extra: tuple[str, ...] = (),
) -> list[ServerCommand]:
    """Each server with only the shape given: slots, context per slot, threads (and, for a
    what-if run that is not the defaults' figure, `extra` arguments to `candlewick serve`)."""
    ours, theirs = free_port(), free_port()
    return [
        ServerCommand(
            CANDLEWICK,
            [
                str(REPO / ".venv" / "bin" / "candlewick"),
                *("serve", "--model", str(model), "--parallel", str(slots)),
                *("--ctx", str(ctx), "--threads", str(threads), "--port", str(ours)),
                *extra,
            ],
            ours,
        ),
        ServerCommand(
            LLAMA_SERVER,
            [
                llama_server,
                *("-m", str(model), "-np", str(slots), "-c", str(slots * ctx)),
                *("-t", str(threads), "--port", str(theirs)),
            ],
            theirs,
        ),
    ]


def last_lines(log: Path, n: int = 3) -> str:
    lines = [ln.strip() for ln in log.read_text("utf-8", "replace").splitlines() if ln.strip()]
    return " | ".join(lines[-n:]) or "(no output)"


def wait_up(cmd: ServerCommand, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> str:
    """Polls /health until the model is ready (both answer 200 with status "ok"); returns the
    model id of /v1/models. A server that exits or stays down is one line with its output."""
    url = f"http://127.0.0.1:{cmd.port}"
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise BenchError(
                f"{cmd.name} did not come up: exited with {proc.returncode}: {last_lines(log)}"
            )
        with contextlib.suppress(httpx.HTTPError, ValueError):
            r = httpx.get(url + "/health", timeout=2)
            if r.status_code == 200 and r.json().get("status") == "ok":
                return str(httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"])
        time.sleep(0.25)
    raise BenchError(f"{cmd.name} did not come up in {timeout:.0f} s: {last_lines(log)}")


@contextlib.contextmanager
def running(cmd: ServerCommand, folder: Path, timeout: float = 300) -> Iterator[Endpoint]:
    """The server started, its model ready; stopped (killed if it must be) on the way out."""
    log = folder / f"{cmd.name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    try:
        model = wait_up(cmd, proc, log, timeout)
        yield Endpoint(cmd.name, f"http://127.0.0.1:{cmd.port}", model)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def serve_and_measure(cmds: Sequence[ServerCommand], plan: Plan) -> dict[str, list[Round]]:
    with (
        tempfile.TemporaryDirectory(prefix="serving-defaults-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        endpoints = [stack.enter_context(running(c, Path(tmp))) for c in cmds]
        return asyncio.run(measure(endpoints, plan))


# -- figures ----------------------------------------------------------------------------------


def spread(values: Sequence[float], digits: int = 1) -> dict[str, Any]:
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "values": [round(v, digits) for v in values],
    }


FIGURES = ("ttft_ms", "tps_1", "tps_burst")


def figures(rounds: Sequence[Round]) -> dict[str, list[float]]:
    return {
        "ttft_ms": [r.ttft_ms for r in rounds],
        "tps_1": [r.tps_1 for r in rounds],
        "tps_burst": [r.tps_burst for r in rounds],
    }


def cache_record(rounds: Sequence[Round]) -> dict[str, Any]:
    """Which prompt tokens the server read from its cache, per round: the single request's
    (with the server's own timings) and the burst's."""

    def one(reply: Reply) -> dict[str, Any]:
        out: dict[str, Any] = {"prompt_tokens": reply.prompt_tokens, "cached": reply.cached_tokens}
        if reply.timings is not None:
            keys = ("cache_n", "prompt_n", "prompt_ms")
            out["timings"] = {k: reply.timings[k] for k in keys if k in reply.timings}
        return out

    return {
        "single": [one(r.single) for r in rounds],
        "single_server_ttft_ms": [
            None if r.server_ttft_s is None else round(r.server_ttft_s * 1000, 1) for r in rounds
        ],
        "burst_cached": [[b.cached_tokens for b in r.burst] for r in rounds],
    }


def summarize(by_server: dict[str, list[Round]]) -> dict[str, Any]:
    """Per server: median and min-max of each figure; candlewick/llama-server: the ratio of
    the medians and the min-max of the per-round ratios (the rounds alternate, so round r of
    one is paired with round r of the other)."""
    figs = {name: figures(rounds) for name, rounds in by_server.items()}
    out: dict[str, Any] = {
        name: {k: spread(v) for k, v in f.items()} | {"cache": cache_record(by_server[name])}
        for name, f in figs.items()
    }
    ours, theirs = figs[CANDLEWICK], figs[LLAMA_SERVER]
    out["ratios"] = {
        k: {
            "of_medians": round(statistics.median(ours[k]) / statistics.median(theirs[k]), 3),
            "per_round": spread([a / b for a, b in zip(ours[k], theirs[k], strict=True)], 3),
        }
        for k in FIGURES
    }
    out["ratios"]["better"] = {
        "ttft_ms": "lower: a ratio <= 1.0 is Candlewick as fast or faster",
        "tps_1": "higher: a ratio >= 1.0 is Candlewick as fast or faster",
        "tps_burst": "higher: a ratio >= 1.0 is Candlewick as fast or faster",
    }
    return out


def _cell(s: dict[str, Any], digits: int = 1) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def _cached(summary: dict[str, Any]) -> str:
    singles = summary["cache"]["single"]
    cached = [s["cached"] for s in singles]
    if any(c is None for c in cached):
        return "not reported"
    return f"{statistics.median(cached):.0f} of {singles[0]['prompt_tokens']}"


def _inside(summary: dict[str, Any]) -> str:
    """The single request's time inside the server, median ms: llama-server's prefill
    (`timings.prompt_ms`), Candlewick's arrival to first text (/metrics)."""
    cache = summary["cache"]
    ms = [v for v in cache["single_server_ttft_ms"] if v is not None]
    ms += [
        s["timings"]["prompt_ms"] for s in cache["single"] if "prompt_ms" in s.get("timings", {})
    ]
    return f"{statistics.median(ms):.1f}" if ms else "not reported"


def table(summary: dict[str, Any], slots: int, shown: str, versions: dict[str, str]) -> str:
    ours, theirs, ratios = summary[CANDLEWICK], summary[LLAMA_SERVER], summary["ratios"]
    rows = [
        ("TTFT, one request, ms (lower is better)", "ttft_ms"),
        ("tokens/s, one request (higher is better)", "tps_1"),
        (f"tokens/s, {slots} concurrent (higher is better)", "tps_burst"),
    ]
    lines = [
        f"`{shown}`",
        "",
        "| figure | llama-server | candlewick serve | candlewick / llama-server |",
        "|---|---:|---:|---:|",
    ]
    for label, key in rows:
        r = ratios[key]
        lines.append(
            f"| {label} | {_cell(theirs[key])} | {_cell(ours[key])} | "
            f"{r['of_medians']:.2f} ({r['per_round']['min']:.2f}-{r['per_round']['max']:.2f}) |"
        )
    lines.append(
        f"| the single request's prompt tokens read from cache (median) | {_cached(theirs)} | "
        f"{_cached(ours)} | |"
    )
    lines.append(
        "| the single request inside the server, ms (llama-server: prefill, `timings.prompt_ms`;"
        f" Candlewick: arrival to first text, /metrics) | {_inside(theirs)} | {_inside(ours)} | |"
    )
    lines += [
        "",
        "Medians over the rounds, (min-max); the ratio is of the medians, (min-max) of the "
        "rounds' paired ratios. TTFT: a ratio <= 1.0 is Candlewick as fast or faster; "
        "tokens/s: >= 1.0.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".",
    ]
    return "\n".join(lines)


def engine_table(engine: dict[str, Any]) -> str:
    """The engine alone (host_clients decode): one request through the host vs the C-API
    loop on the same context, and `candlewick run`'s defaults vs llama.cpp's."""
    rows = [("one request through the host / C-API loop, same context", engine["host_ratio"])]
    rows += [
        (f"`candlewick run` defaults / llama.cpp defaults + C-API loop, {k} prompt", v)
        for k, v in engine["defaults_ratio"].items()
    ]
    lines = [
        "",
        "| engine alone (greedy, 128 tokens, pairs alternating) | ratio median (min-max) |",
    ]
    lines.append("|---|---:|")
    lines += [f"| {label} | {_cell(s, 3)} |" for label, s in rows]
    return "\n".join(lines)


# -- the run ----------------------------------------------------------------------------------


def shown_command(argv: Sequence[str]) -> str:
    """The command line as the docs show it: no machine's paths, no --write."""
    out = [".venv/bin/python", "benchmarks/serving_defaults.py"]
    it = iter(argv)
    for a in it:
        if a in ("--write", "--table"):
            next(it, None)
        elif a == "--llama-server":
            next(it, None)
            out += [a, "PATH/llama-server"]
        elif a == "--model":
            out += [a, Path(next(it, "")).name]
        else:
            out.append(a)
    return " ".join(out)


def versions(llama_server: str) -> dict[str, str]:
    meta = importlib.metadata.version
    out = {"candlewick": meta("candlewick")}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if head.returncode == 0:
            out["candlewick"] += f" ({head.stdout.strip()})"
    out["llama-cpp-python"] = meta("llama_cpp_python")
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        r = subprocess.run([llama_server, "--version"], capture_output=True, text=True, timeout=60)
        found = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("version:")]
        if found:
            out["llama-server"] = found[0].removeprefix("version:").strip()
    out["openai"] = meta("openai")
    return out


def engine_figures(model: Path, pairs: int) -> dict[str, Any]:
    """host_clients decode, as it runs alone; its pairs as ratios with their spread."""
    from benchmarks import host_clients

    raw = host_clients.decode(argparse.Namespace(model=str(model), pairs=pairs, tokens=128))
    host = [a / b for a, b in zip(raw["host"], raw["reference"], strict=True)]
    defaults = {
        label: spread([a / b for a, b in zip(p["product"], p["llama"], strict=True)], 3)
        for label, p in raw["defaults_pairs"].items()
    }
    return {"host_ratio": spread(host, 3), "defaults_ratio": defaults, "raw": raw}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--llama-server", required=True, help="llama-server built as above")
    ap.add_argument("--model", default=None, help="a .gguf file (default: the bundled SmolLM2)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slots", type=int, default=8, help="slots, and the burst's size")
    ap.add_argument("--ctx-per-slot", type=int, default=4096)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--engine", action="store_true", help="add the engine-only figures")
    ap.add_argument("--engine-pairs", type=int, default=5)
    ap.add_argument("--write", type=Path, default=None, help="replace the table in this page")
    ap.add_argument(
        "--table",
        default="serving-defaults-table",
        help="which table of the page (its <!-- NAME:start --> marker; one per CPU)",
    )
    ap.add_argument(
        "--candlewick-arg",
        action="append",
        default=[],
        help="what-if: one more argument to candlewick serve (repeatable; not with --write)",
    )
    return ap.parse_args(argv)


def model_file(arg: str | None) -> Path:
    from app.services.library import bundled_default_model

    path = Path(arg) if arg else bundled_default_model()
    if path is None or not path.is_file():
        raise BenchError(
            f"no model file {arg or '(bundled default)'}: pass --model or run make setup"
        )
    return path


def run(argv: Sequence[str]) -> dict[str, Any]:
    args = parse_args(argv)
    model = model_file(args.model)
    if not Path(args.llama_server).is_file():
        raise BenchError(f"no llama-server at {args.llama_server} (build it as the docstring says)")
    plan = Plan(rounds=args.rounds, slots=args.slots, max_tokens=args.max_tokens)
    if args.candlewick_arg and args.write:
        raise SystemExit("--candlewick-arg is a what-if: it does not write the defaults' table")
    cmds = commands(
        model,
        args.llama_server,
        args.threads,
        args.slots,
        args.ctx_per_slot,
        tuple(args.candlewick_arg),
    )
    by_server = serve_and_measure(cmds, plan)
    summary = summarize(by_server)
    shown = shown_command(argv)
    vers = versions(args.llama_server)
    text = table(summary, args.slots, shown, vers)
    result: dict[str, Any] = {
        "command": shown,
        "servers": {c.name: c.argv for c in cmds},
        "summary": summary,
        "versions": vers,
        "machine": machine_line(),
    }
    if args.engine:
        result["engine"] = engine_figures(model, args.engine_pairs)
        text += "\n" + engine_table(result["engine"])
    result["table"] = text
    if args.write is not None:
        replace_between(
            args.write, f"<!-- {args.table}:start -->", f"<!-- {args.table}:end -->", text
        )
    return result


def main(argv: Sequence[str] | None = None) -> int:
    try:
        result = run(sys.argv[1:] if argv is None else argv)
    except BenchError as e:
        print(f"serving_defaults: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
