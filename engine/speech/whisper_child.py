"""whisper.cpp (through pywhispercpp's binding) in a child process that keeps a model loaded.

`python -m engine.speech.whisper_child` (or the frozen app with CHILD_ARG) reads requests from
stdin and answers on stdout, one JSON line each; a transcription's request line is followed by
its samples (float32 mono 16 kHz, `bytes` long). The first request loads the model.

Why a child: whisper.cpp aborts the process on some files it accepts (an f32 model stops on
a GGML_ASSERT in its convolution, a tiny vocabulary on an out-of-range lookup), and an app or
server must not end with it. It also keeps pywhispercpp's own libggml out of the process
that runs llama.cpp's: on Linux both load RTLD_LOCAL and bind their own copies, but Windows
resolves DLLs by name, where two ggml-base.dll could not both be loaded.

Greedy decoding, temperature 0 and no temperature fallback, so a transcript is the same
as whisper.cpp's command line run with `-nf -bs 1 -bo 1` on the same model, file and threads.
"""

from __future__ import annotations

import json
import os
import sys
from typing import IO, Any

CHILD_ARG = "--whisper-child"
SAMPLE_RATE = 16000
GGML_LOG_ERROR = 4


class _Whisper:
    """One whisper.cpp context (a model and its state), used from one thread."""

    def __init__(self, path: str, threads: int) -> None:
        import _pywhispercpp as pw

        self.pw: Any = pw
        self.errors: list[str] = []
        pw.whisper_log_set(self._log)
        params = pw.whisper_context_default_params()
        params.use_gpu = False
        self.ctx = pw.whisper_init_from_file_with_params(path, params)
        # The binding wraps a NULL context too (and using it would crash): whisper.cpp logs an
        # error whenever it returns one, so a logged error is the failure.
        if self.errors:
            pw.whisper_log_set(None)  # see close()
            raise RuntimeError(self.errors[0])
        self.threads = threads
        self.multilingual = bool(pw.whisper_is_multilingual(self.ctx))

    def close(self) -> None:
        """Free the model, then drop the log callback: whisper.cpp logs while it frees, and a
        Python callback left set would be called during the interpreter's finalization (an
        abort at exit)."""
        self.pw.whisper_free(self.ctx)
        self.pw.whisper_log_set(None)

    def _log(self, level: int, text: str) -> None:
        if level == GGML_LOG_ERROR and text.strip():
            self.errors.append(text.strip().removeprefix("whisper_model_load: "))

    def transcribe(self, samples: Any, req: dict[str, Any]) -> dict[str, Any]:
        pw = self.pw
        params = pw.whisper_full_default_params(pw.WHISPER_SAMPLING_GREEDY)
        params.n_threads = self.threads
        params.temperature = 0.0
        params.temperature_inc = 0.0  # no fallback to sampling
        params.print_progress = False
        params.print_realtime = False
        params.print_timestamps = False
        params.translate = bool(req.get("translate"))
        language = req.get("language")
        if language and pw.whisper_lang_id(language) < 0:
            return {"error": f"whisper knows no language '{language}'", "field": "language"}
        if (language not in (None, "en") or params.translate) and not self.multilingual:
            return {"error": "this speech model knows English only", "field": "language"}
        params.language = language or ""  # empty: detected from the audio
        if req.get("prompt"):
            params.initial_prompt = req["prompt"]
        self.errors.clear()
        if pw.whisper_full(self.ctx, params, samples, len(samples)) != 0:
            return {"error": self.errors[-1] if self.errors else "whisper.cpp failed"}
        segments = []
        for i in range(pw.whisper_full_n_segments(self.ctx)):
            segments.append(
                {
                    "start": pw.whisper_full_get_segment_t0(self.ctx, i) / 100,
                    "end": pw.whisper_full_get_segment_t1(self.ctx, i) / 100,
                    # bytes: a character may be split across segments; joined by the parent
                    "text": bytes(pw.whisper_full_get_segment_text(self.ctx, i)).hex(),
                }
            )
        lang = pw.whisper_lang_str(pw.whisper_full_lang_id(self.ctx)) or (language or "en")
        return {"segments": segments, "language": lang}


def serve(inp: IO[bytes], out: IO[bytes]) -> None:
    """Answer requests until the end of input; then free the model."""
    import numpy as np

    whisper: _Whisper | None = None
    try:
        while line := inp.readline():
            req = json.loads(line)
            payload = inp.read(int(req.get("bytes", 0)))
            if req["op"] == "load":
                try:
                    whisper = _Whisper(req["path"], int(req["threads"]))
                    reply: dict[str, Any] = {"ok": True, "multilingual": whisper.multilingual}
                except Exception as e:  # one line for the parent's message
                    reply = {"error": str(e).splitlines()[0] if str(e) else type(e).__name__}
            elif whisper is None:
                reply = {"error": "no model loaded"}
            else:
                reply = whisper.transcribe(np.frombuffer(payload, dtype=np.float32), req)
            out.write(json.dumps(reply).encode() + b"\n")
            out.flush()
    finally:
        if whisper is not None:
            whisper.close()


def main() -> None:
    # The protocol gets stdout's pipe to itself; anything a library prints goes to stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    serve(sys.stdin.buffer, out)


if __name__ == "__main__":
    main()
