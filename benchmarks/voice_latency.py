"""From the end of a spoken question to the first spoken word of the answer, on the test
models, split into its parts (docs/benchmarks.md, "Voice latency").

    .venv/bin/python benchmarks/voice_latency.py [--runs 7] [--stt-model PATH] [--model PATH]

Each run, as the app does it with the chat's model already loaded:

1. transcription: the question, spoken by espeak-ng (the app's `default` voice) and read at
   16 kHz, transcribed by the whisper.cpp model (`engine.speech.transcriber`; by default the
   random-weight test model `scripts/make_test_speech_models.py` writes, whose transcript is
   meaningless, so the chat is then asked the question's own text);
2. time to first token: the chat model (the bundled SmolLM2) answering it, greedy, through
   the host's decode loop;
3. the rest of the first sentence: tokens until `SentenceSplitter` gives its first sentence
   (the voice cannot start before a sentence is complete);
4. first sentence synthesis: that sentence spoken by the `default` voice (and, when the
   `voice` extra is installed, by a Kokoro voice on a Japanese sentence of the same length).

The parts run one after another, as in the app, so the total is their sum. Each question is
asked once per run (distinct questions: no answer is served from the prompt cache); the first
run warms up and is not counted; medians are reported.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from app.services.library import bundled_default_model  # noqa: E402
from benchmarks.doc_tables import machine_line  # noqa: E402
from engine.host.runtime import Model  # noqa: E402
from engine.media.audio import decode_wav  # noqa: E402
from engine.settings import LoadParams, SamplingParams  # noqa: E402
from engine.speech import kokoro_voice  # noqa: E402
from engine.speech.pcm import to_wav  # noqa: E402
from engine.speech.sentences import SentenceSplitter  # noqa: E402
from engine.speech.synth import Synthesizer  # noqa: E402

QUESTIONS = [
    "What is the capital of France?",
    "How do I boil an egg?",
    "Why is the sky blue?",
    "What should I pack for a day at the beach?",
    "How many legs does a spider have?",
    "What is a good name for a cat?",
    "How do plants make food from sunlight?",
    "What is the tallest mountain in the world?",
]
# A Japanese sentence for the neural voice, about as long spoken as a first English sentence.
JAPANESE = "今日はとてもいい天気なので、公園まで散歩に行きましょう。"
KOKORO_ROW = "first sentence synthesis (Kokoro jf_alpha, a Japanese sentence)"
STT_RATE = 16000


def stt_model(arg: str | None, work: Path) -> Path:
    if arg:
        return Path(arg)
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_test_speech_models.py"), str(work)],
        check=True,
        capture_output=True,
    )
    return work / "stt.bin"


def spoken_question(speech: Synthesizer, text: str) -> np.ndarray:
    """The question as the microphone would give it: espeak-ng's speech at 16 kHz."""
    samples = decode_wav(to_wav(speech.synthesize(text)), STT_RATE)
    return np.frombuffer(samples.pcm, dtype=np.float32)


def first_sentence(model: Model, question: str) -> tuple[float, float, str]:
    """(time to first token, time from it to the first whole sentence, that sentence)."""
    cancel = threading.Event()
    sampling = SamplingParams(temperature=0, max_tokens=200)
    t0 = time.perf_counter()
    gen = model.generate([{"role": "user", "content": question}], sampling, cancel=cancel)
    splitter = SentenceSplitter()
    t_first: float | None = None
    sentence = ""
    for piece in gen:
        if t_first is None:
            t_first = time.perf_counter()
        done = splitter.feed(piece)
        if done:
            sentence = done[0]
            break
    t_sentence = time.perf_counter()
    cancel.set()
    for _ in gen:  # the cancelled reply ends; its slot is free for the next run
        pass
    if not sentence:
        sentence = (splitter.flush() or [""])[0]
    assert t_first is not None and sentence, f"no answer to {question!r}"
    return t_first - t0, t_sentence - t_first, sentence


def run(args: argparse.Namespace) -> dict[str, Any]:
    from engine.speech.transcriber import Transcriber

    model_path = Path(args.model) if args.model else bundled_default_model()
    if model_path is None:
        raise SystemExit("no chat model: pass --model or run `make setup`")
    speech = Synthesizer()
    kokoro = kokoro_voice.installed()
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        stt_path = stt_model(args.stt_model, Path(tmp))
        transcriber = stack.enter_context(Transcriber(stt_path))  # its child keeps it loaded
        audio = [spoken_question(speech, q) for q in QUESTIONS]
        if kokoro:
            t = time.perf_counter()
            kokoro_seconds = speech.synthesize(JAPANESE, voice="kokoro-jf_alpha").seconds
            kokoro_load = time.perf_counter() - t
        parts: dict[str, list[float]] = {}
        sentences: list[str] = []
        transcripts: list[int] = []  # characters: the random model writes until its limit
        with Model(model_path, LoadParams(n_ctx=4096)) as model:
            for i in range(args.runs + 1):
                q = i % len(QUESTIONS)
                t = time.perf_counter()
                heard = transcriber.transcribe(audio[q]).text
                stt = time.perf_counter() - t
                ttft, rest, sentence = first_sentence(model, QUESTIONS[q])
                t = time.perf_counter()
                pcm = speech.synthesize(sentence)
                synth = time.perf_counter() - t
                row = {
                    "transcription": stt,
                    "time to first token": ttft,
                    "rest of the first sentence": rest,
                    "first sentence synthesis (espeak-ng default)": synth,
                }
                row["total"] = sum(row.values())
                if kokoro:
                    t = time.perf_counter()
                    speech.synthesize(JAPANESE, "kokoro-jf_alpha")
                    row[KOKORO_ROW] = time.perf_counter() - t
                if i == 0:
                    continue  # warm-up
                sentences.append(f"{sentence} ({pcm.seconds:.1f} s spoken)")
                transcripts.append(len(heard))
                for k, v in row.items():
                    parts.setdefault(k, []).append(v)
    out: dict[str, Any] = {
        "runs": args.runs,
        "question_audio_s": round(statistics.median(len(a) / STT_RATE for a in audio), 2),
        "median_ms": {k: round(statistics.median(v) * 1000, 1) for k, v in parts.items()},
        "min_ms": {k: round(min(v) * 1000, 1) for k, v in parts.items()},
        "max_ms": {k: round(max(v) * 1000, 1) for k, v in parts.items()},
        "first_sentences": sentences,
        "transcript_chars_median": statistics.median(transcripts),
        "stt_model": stt_path.name if args.stt_model else "test model (make_test_speech_models)",
        "chat_model": model_path.name,
        "machine": machine_line(),
    }
    if kokoro:
        out["kokoro_first_call_ms"] = round(kokoro_load * 1000)  # the model loaded
        out["kokoro_sentence_spoken_s"] = round(kokoro_seconds, 2)
    return out


def table(result: dict[str, Any]) -> str:
    lines = ["| part | median ms | min | max |", "|---|---:|---:|---:|"]
    for k, v in result["median_ms"].items():
        lines.append(f"| {k} | {v} | {result['min_ms'][k]} | {result['max_ms'][k]} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--stt-model", default=None, help="a whisper.cpp ggml model")
    ap.add_argument("--model", default=None, help="the chat model (default: the bundled one)")
    args = ap.parse_args()
    result = run(args)
    print(json.dumps(result, indent=1, ensure_ascii=False))
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
