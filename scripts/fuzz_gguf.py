"""Feed thousands of broken copies of a GGUF model to the loader and count what happens.

    .venv/bin/python scripts/fuzz_gguf.py --files 3000 --seed 1 [--model PATH] [--cli]
    .venv/bin/python scripts/fuzz_gguf.py --files 300 --projector MMPROJ [--model PATH]

Each file is a seeded mutation of the model (tests/fuzz_gguf.py: metadata values, the tensor
table, header bit flips), loaded in a child process by the real loader (validation, the
memory estimate, llama.cpp). Prints how many were refused, loaded, crashed, raised a traceback
or hung (with `--cli`, each file goes through `candlewick run` as a separate process, exit code
and stderr checked), the most common refusal reasons, and every crash, traceback or hang in full.
Exit code 1 if there was any of those.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fuzz_gguf import Result, is_one_line, run_corpus  # noqa: E402

BAD = ("crash", "traceback", "hang")


def _reason(message: str) -> str:
    """A refusal with its numbers and names blanked, to group similar ones."""
    text = message.split(": ", 1)[-1]
    text = re.sub(r"'[^']*'", "'…'", text)
    return re.sub(r"\d+", "N", text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--model", type=Path, default=None, help="default: the bundled SmolLM2")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per file")
    ap.add_argument(
        "--cli", action="store_true", help="through `candlewick run`, one process per file"
    )
    ap.add_argument(
        "--projector",
        type=Path,
        default=None,
        metavar="MMPROJ",
        help="mutate this projector instead, each copy through `candlewick run MODEL --mmproj`",
    )
    args = ap.parse_args()
    model = args.model
    if model is None:
        from app.services.library import bundled_default_model

        model = bundled_default_model()
        assert model is not None, "no bundled model"
    t0 = time.monotonic()
    done = 0

    def progress(r: Result) -> None:
        nonlocal done
        done += 1
        if r.outcome in BAD:
            print(f"[{done}] {r.outcome.upper()}: {r.label}: {r.message}", flush=True)
        elif done % 100 == 0:
            print(f"[{done}/{args.files}] {time.monotonic() - t0:.0f} s", flush=True)

    with tempfile.TemporaryDirectory(prefix="fuzz-gguf-") as work:
        results = run_corpus(
            args.projector or model,
            args.seed,
            args.files,
            Path(work),
            timeout_s=args.timeout,
            cli=args.cli,
            on_result=progress,
            projector_for=model if args.projector else None,
        )
    counts = collections.Counter(r.outcome for r in results)
    multi = [r for r in results if r.outcome == "refused" and not is_one_line(r.message)]
    print(
        f"\n{len(results)} files (seed {args.seed}) in {time.monotonic() - t0:.0f} s: "
        + ", ".join(f"{k} {counts[k]}" for k in ("refused", "loaded", *BAD))
    )
    print(f"refusals longer than one line: {len(multi)}")
    reasons = collections.Counter(_reason(r.message) for r in results if r.outcome == "refused")
    print("\nmost common refusals:")
    for reason, n in reasons.most_common(25):
        print(f"{n:6d}  {reason}")
    return 1 if any(counts[k] for k in BAD) or multi else 0


if __name__ == "__main__":
    raise SystemExit(main())
