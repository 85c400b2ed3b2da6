"""Write a small multimodal test projector (an "mmproj" GGUF) with seeded random weights.

    .venv/bin/python scripts/make_test_projector.py OUT.gguf           # idefics3 vision
    .venv/bin/python scripts/make_test_projector.py OUT.gguf --audio   # ultravox audio

Both are for SmolLM2-135M (output width 576) and load in llama.cpp's libmtmd; their weights are
noise, so what a text model says about their embeddings means nothing (layout, seed and sizes:
tests/projector_gguf.py, docs/multimodal.md). Prints what it wrote; exit code 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import projector_gguf as pg  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="the GGUF file to write")
    ap.add_argument("--audio", action="store_true", help="the ultravox audio projector")
    args = ap.parse_args()
    out: Path = args.out
    if args.audio:
        pg.write_audio_projector(out)
        per_second = pg.TOKENS_PER_AUDIO_WINDOW / pg.WINDOW_SECONDS
        what = (
            f"ultravox audio projector: {pg.TOKENS_PER_AUDIO_WINDOW} tokens per started "
            f"{pg.WINDOW_SECONDS} s window ({per_second:g} per second of audio), "
            f"{pg.SAMPLE_RATE} Hz, {pg.N_MEL} mel bins"
        )
    else:
        pg.write_vision_projector(out)
        what = (
            f"idefics3 vision projector: {pg.IMAGE_SIZE}x{pg.IMAGE_SIZE} px, patch "
            f"{pg.PATCH_SIZE}, scale factor {pg.SCALE_FACTOR}, {pg.TOKENS_PER_IMAGE} tokens per "
            f"image chunk (a {pg.IMAGE_SIZE} px picture gives {pg.IMAGE_CHUNKS_PER_BITMAP}: "
            f"its tile and its overview)"
        )
    size = out.stat().st_size
    print(f"wrote {out} ({size / 1e6:.2f} MB): {what}; output width {pg.N_EMBD_TEXT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
