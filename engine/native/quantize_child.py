"""llama.cpp's `llama_model_quantize`, run as a child process.

`python -m engine.native.quantize_child` reads a `QuantizeJob` as JSON on stdin, prints
STARTED, quantizes with llama.cpp's log going to stderr as it comes (one "[  12/ 272]
blk.0.attn_k.weight ..." line per tensor, which the parent reads as progress), and writes
`{"rc": ...}` (llama_model_quantize's return code, 0 on success) as the last line of stdout.
A child is what makes the work cancellable (the parent kills it: llama.cpp has no way to stop
a quantization) and keeps an abort inside llama.cpp from ending the app.

Lean like engine.native.native_load: the ctypes bindings without the `llama_cpp` package's
`__init__`, and nothing else from the engine. engine.native.quantize_process runs it.
"""

from __future__ import annotations

import ctypes
import json
import sys
from dataclasses import asdict, dataclass
from typing import Any

from engine.native.native_load import _bindings

# A frozen app (no interpreter to start) runs itself with this argument as the child.
CHILD_ARG = "--quantize-child"
STARTED = "candlewick-quantize: started"


@dataclass(frozen=True)
class QuantizeJob:
    """What llama_model_quantize is given."""

    source: str
    target: str
    file_type: int  # llama_ftype
    allow_requantize: bool = False  # llama.cpp refuses to quantize quantized tensors without
    threads: int = 0  # 0: every core

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def run(job: QuantizeJob, C: Any) -> int:
    @C.llama_log_callback  # type: ignore[untyped-decorator]
    def on_log(_level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        # Pieces of a line arrive as they are logged; the parent reads whole lines.
        sys.stderr.write(text.decode("utf-8", errors="replace"))
        sys.stderr.flush()

    C.llama_log_set(on_log, ctypes.c_void_p(0))
    C.llama_backend_init()
    params = C.llama_model_quantize_default_params()
    params.nthread = job.threads
    params.ftype = job.file_type
    params.allow_requantize = job.allow_requantize
    return int(
        C.llama_model_quantize(job.source.encode(), job.target.encode(), ctypes.byref(params))
    )


def main() -> None:
    job = QuantizeJob(**json.loads(sys.stdin.read()))
    C = _bindings()
    sys.stdout.write(STARTED + "\n")
    sys.stdout.flush()  # reaches the parent even if llama.cpp aborts the process next
    rc = run(job, C)
    sys.stderr.write("\n")
    sys.stderr.flush()
    sys.stdout.write("\n" + json.dumps({"rc": rc}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
