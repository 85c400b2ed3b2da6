"""Write the speech test assets into DIR: WAV files of known sentences and a tiny whisper model.

    .venv/bin/python scripts/make_test_speech_models.py DIR

- DIR/NAME.wav: each sentence of tests/speech_assets.py's SENTENCES spoken offline by
  espeak-ng (`apt-get install espeak-ng`), as 16 kHz mono 16-bit PCM;
- DIR/stt.bin: a whisper.cpp model (its legacy ggml binary layout: hyper-parameters, mel
  filters, vocabulary, tensors, as whisper.cpp's convert script writes it) with tiny
  dimensions and seeded random weights: its transcript is meaningless, but the same in
  Candlewick and in whisper.cpp's own whisper-cli (`make whisper-cli`). The `gguf` package
  cannot write this layout (it is not GGUF), so tests/speech_assets.py writes it with struct;
- DIR/audio-projector.gguf: the ultravox audio projector for SmolLM2 (scripts/
  make_test_projector.py --audio), for the audio-attachment path.

Prints what it wrote; exit code 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import projector_gguf, speech_assets  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path, help="the folder to write into")
    args = ap.parse_args()
    folder: Path = args.dir
    made = speech_assets.write_all(folder)
    projector = projector_gguf.write_audio_projector(folder / "audio-projector.gguf")
    for name, wav in made.wavs.items():
        print(f"wrote {wav}: {speech_assets.SENTENCES[name]!r}")
    size = made.stt_model.stat().st_size / 1e6
    print(f"wrote {made.stt_model} ({size:.1f} MB): random-weight whisper model")
    print(f"wrote {projector}: ultravox audio projector for SmolLM2")
    return 0


if __name__ == "__main__":
    sys.exit(main())
