"""Write a small LoRA adapter (a GGUF "adapter" file) with seeded random weights for a model.

    .venv/bin/python scripts/make_test_lora.py BASE.gguf OUT.gguf

Rank-8 adapters on every layer's attn_q and attn_v, in the layout llama.cpp's
convert_lora_to_gguf.py writes (layout, seed and sizes: tests/lora_gguf.py); made for
SmolLM2-135M, it loads on any model of the same architecture and widths. Its weights are noise:
at scale 1 the model says something else, nothing better. Prints what it wrote; exit code 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import lora_gguf  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", type=Path, help="the model the adapter is for (GGUF)")
    ap.add_argument("out", type=Path, help="the adapter file to write")
    args = ap.parse_args()
    lora_gguf.write_lora(args.base, args.out)
    size = lora_gguf.tensor_bytes(args.out)
    print(
        f"wrote {args.out}: LoRA rank {lora_gguf.RANK} on {', '.join(lora_gguf.TARGETS)}, "
        f"{size / 2**20:.1f} MiB of tensors"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
