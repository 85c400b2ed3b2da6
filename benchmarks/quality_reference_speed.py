"""The reference pass of `bench quality` against llama-perplexity's `--kl-divergence-base` pass,
alternating, so that other programs' load reaches both: tokens/s of each and their ratio per
round (the median of the rounds' ratios is the figure).

Both score the same text (the built-in corpus), context and chunks and keep the reference's
log-probabilities: llama-perplexity writes its 16-bit codes to a file, Candlewick keeps its
float32 values above the floor in memory (`TextScorer.reference_pass`, as `bench quality
--no-cache` does). llama-perplexity's tokens/s is timed as in `quality_side_by_side.py` (from
its line that starts the chunks to its exit), Candlewick's is its pass (decoding and
arithmetic; the model is loaded before the clock starts, as llama-perplexity's is).

    .venv/bin/python benchmarks/quality_reference_speed.py \\
        --llama-perplexity LLAMA_CPP/build/bin/llama-perplexity [--models default,gemma] \\
        [--rounds 3] [--ctx 512] [--threads 2]

The build of llama-perplexity: see `quality_side_by_side.py`. The last lines start with
SUMMARY: the median ratio per model.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.doc_tables import machine_line
from benchmarks.quality_side_by_side import _load, _resolve, llama_reference
from engine.bench.quality_pass import TextScorer, plan
from engine.bench.quality_text import builtin_text


def candlewick_reference(model: Path, text: str, ctx: int, threads: int) -> float:
    """Tokens/s of Candlewick's reference pass over every whole chunk of `text`."""
    m = _load(model, threads=threads)
    try:
        tokens = m.tokenize(text, add_special=True, parse_special=False)
        chunking = plan(len(tokens), ctx)
        scorer = TextScorer(m, chunking)
        try:
            ref = scorer.reference_pass(tokens)
        finally:
            scorer.close()
    finally:
        m.close()
    return chunking.chunks * ctx / ref.pass_s


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--llama-perplexity", type=Path, required=True)
    ap.add_argument("--models", default="default,gemma")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    corpus = builtin_text()
    load_before = os.getloadavg()[0]
    summary = []
    print("| model | round | llama-perplexity tokens/s | candlewick tokens/s | ratio |")
    print("|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="quality-ref-speed-") as tmp:
        text_file = Path(tmp) / "corpus.txt"
        text_file.write_text(corpus.text, encoding="utf-8")
        for name in args.models.split(","):
            model = _resolve(name)
            probe = _load(model, threads=args.threads)
            try:
                n_tokens = len(probe.tokenize(corpus.text, add_special=True, parse_special=False))
            finally:
                probe.close()
            chunks = plan(n_tokens, args.ctx).chunks
            ratios = []
            for i in range(args.rounds):
                base = Path(tmp) / "ref.kld"
                theirs = llama_reference(
                    args.llama_perplexity, model, text_file, args.ctx, chunks, args.threads, base
                ).tps
                base.unlink(missing_ok=True)
                ours = candlewick_reference(model, corpus.text, args.ctx, args.threads)
                ratios.append(ours / theirs)
                print(
                    f"| {model.name} | {i + 1} | {theirs:.0f} | {ours:.0f} | {ours / theirs:.2f} |",
                    flush=True,
                )
            summary.append(
                f"SUMMARY {model.name}: reference pass x{statistics.median(ratios):.2f} of "
                f"llama-perplexity's tokens/s (rounds {', '.join(f'{r:.2f}' for r in ratios)})"
            )
    print()
    print(
        f"Load average (1 minute): {load_before:.1f} before, {os.getloadavg()[0]:.1f} after "
        f"({os.cpu_count()} cores)."
    )
    print(machine_line())
    for line in summary:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
