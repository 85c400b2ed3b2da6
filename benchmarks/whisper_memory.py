"""The whisper.cpp memory estimate (engine.memory.whisper) against what whisper.cpp logs when
it loads a model of real dimensions, buffer by buffer.

    .venv/bin/python benchmarks/whisper_memory.py [--sizes tiny,base,small] [--out DIR]

Models of whisper's tiny, base and small dimensions (multilingual vocabulary, 448 text
positions, 1500 audio frames, 80 mels) are written with random float32 weights by the test
model's writer (tests/speech_assets.py); whisper.cpp sizes its buffers from the
hyper-parameters alone, so the figures are those of the real models. Each is loaded by
whisper.cpp (pywhispercpp's) in a child process and its log lines read
(tests/whisper_reference.py). Prints a Markdown table (MB of 10^6 bytes) for
docs/model-manager.md. small writes a ~1 GB file.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.memory.whisper import whisper_memory
from engine.model.whisper_file import read_whisper
from tests.speech_assets import HParams, write_whisper_model
from tests.whisper_reference import whisper_cpp_figures

SIZES = {  # width, heads, layers (encoder and decoder alike)
    "tiny": (384, 6, 4),
    "base": (512, 8, 6),
    "small": (768, 12, 12),
    "medium": (1024, 16, 24),
}
ROWS = [
    ("model size", "weights"),
    ("kv self size", "kv_self"),
    ("kv cross size", "kv_cross"),
    ("kv pad size", "kv_pad"),
    ("conv", "compute_conv"),
    ("encode", "compute_encode"),
    ("cross", "compute_cross"),
    ("decode", "compute_decode"),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="tiny,base,small")
    ap.add_argument("--out", type=Path, default=None, help="keep the models here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.out or Path(tmp)
        print("| model | buffer | whisper.cpp | estimate |\n|---|---|---|---|")
        for name in args.sizes.split(","):
            width, heads, layers = SIZES[name]
            hp = HParams(
                n_audio_state=width,
                n_audio_head=heads,
                n_audio_layer=layers,
                n_text_ctx=448,
                n_text_state=width,
                n_text_head=heads,
                n_text_layer=layers,
            )
            path = write_whisper_model(folder / f"ggml-{name}-f32.bin", hp)
            logged = whisper_cpp_figures(path)
            m = whisper_memory(read_whisper(path))
            for log_name, field in ROWS:
                ours = getattr(m, field) / 1e6
                print(f"| {name} | {log_name} | {logged[log_name]:.2f} | {ours:.2f} |", flush=True)
            if args.out is None:
                path.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
