"""A llama.cpp load that reads no weights and allocates nothing, run as a child process.

`python -m engine.native.native_load` reads a `NativeLoad` as JSON on stdin, creates the model and a
context with `no_alloc` (llama.cpp parses the header, loads the vocabulary, creates every
tensor and reserves the compute graph, which is where a broken file makes it assert),
optionally tokenizes a sample text, and writes `{"stage": ..., "log": [...]}` as the last
line of stdout. Every llama.cpp log line also goes to stderr as it comes, so when llama.cpp
aborts the process, the parent reads the assert from the dead child's stderr. Before it calls
llama.cpp it prints STARTED: a child that dies without it never got that far (a missing
module, a library that did not load), which the parent reports as its own failure to start
the child, not as llama.cpp crashing on the file.

The child is kept lean so it costs little more than the in-process dry run: it imports the
ctypes bindings without the `llama_cpp` package's `__init__` (which pulls in numpy and the
high-level API, ~0.15 s) and nothing from the rest of the engine. engine.native.load_probe runs it.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import sys
import types
from dataclasses import asdict, dataclass
from typing import Any

# Honoured only here, in the child: makes the load abort inside llama.cpp (no_alloc with the
# mmap load mode trips one of its asserts), so tests can show what the parent makes of it.
FAULT_ENV = "CANDLEWICK_PROBE_FAULT"
SAMPLE_TEXT = "Hello, world! 123 <|im_start|> ünïcödé 🙂"
# A frozen app (no interpreter to start) runs itself with this argument as the child.
CHILD_ARG = "--native-load-child"
STARTED = "candlewick-native-load: started"


@dataclass(frozen=True)
class NativeLoad:
    """What llama.cpp is given: the model and context settings, as it takes them."""

    path: str
    n_gpu_layers: int = 0
    use_extra_bufts: bool = True
    n_ctx: int = 4096
    n_batch: int = 512
    n_ubatch: int = 512
    n_seq_max: int = 1
    flash_attn_type: int = -1  # -1 auto, 0 off, 1 on
    type_k: int = 1  # ggml types: 1 = f16
    type_v: int = 1
    embeddings: bool = False
    swa_full: bool = True
    kv_unified: bool = False
    tokenize: bool = False  # also tokenize and detokenize SAMPLE_TEXT, as a chat would
    # Also load this projector (an mmproj GGUF) for the model, and run it once on libmtmd's
    # own warm-up input: its weights and compute buffer are then real, and logged.
    mmproj: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def _bindings() -> Any:
    """llama_cpp.llama_cpp without running llama_cpp/__init__.py."""
    if "llama_cpp" not in sys.modules:
        spec = importlib.util.find_spec("llama_cpp")
        if spec is None or spec.submodule_search_locations is None:
            raise ImportError("llama_cpp is not installed")
        pkg = types.ModuleType("llama_cpp")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["llama_cpp"] = pkg
    import llama_cpp.llama_cpp as C

    return C


def run(load: NativeLoad, C: Any = None) -> dict[str, Any]:
    C = C or _bindings()
    lines: list[str] = []
    pending = [""]

    @C.llama_log_callback  # type: ignore[untyped-decorator]
    def on_log(_level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        pending[0] += text.decode("utf-8", errors="replace")
        *done, pending[0] = pending[0].split("\n")
        for line in done:
            lines.append(line)
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    C.llama_log_set(on_log, ctypes.c_void_p(0))
    C.llama_backend_init()
    # Never mmap with no_alloc: llama.cpp aborts (which is what the fault hook wants).
    stage = load_no_alloc(C, load, fault=os.environ.get(FAULT_ENV) == "abort")
    if stage == "ok" and load.mmproj:
        stage = load_projector(C, load, on_log)
    return {"stage": stage, "log": lines}


def load_projector(C: Any, load: NativeLoad, on_log: Any) -> str:
    """Load `load.mmproj` for the model (its header and vocabulary only: libmtmd checks the
    width and looks up marker tokens) and warm it up; 'projector' when libmtmd refuses."""
    import llama_cpp.mtmd_cpp as M  # after _bindings: the package's __init__ stays unrun

    M.mtmd_log_set(on_log, ctypes.c_void_p(0))
    mp = C.llama_model_default_params()
    mp.n_gpu_layers = 0
    mp.no_alloc = True
    mp.load_mode = C.LLAMA_LOAD_MODE_NONE
    model = C.llama_model_load_from_file(load.path.encode(), mp)
    if not model:
        return "model"
    try:
        params = M.mtmd_context_params_default()
        params.use_gpu = False
        params.print_timings = False
        params.n_threads = max(1, min(4, os.cpu_count() or 1))
        params.warmup = True
        ctx = M.mtmd_init_from_file(load.mmproj.encode(), model, params)
        if not ctx:
            return "projector"
        M.mtmd_free(ctx)
    finally:
        C.llama_model_free(model)
    return "ok"


def load_no_alloc(C: Any, load: NativeLoad, *, fault: bool = False) -> str:
    """Create `load`'s model and context with `no_alloc` through the bindings `C` (the
    caller captures the log); 'model' or 'context' for the step llama.cpp refused, else 'ok'.
    The in-process dry run (engine.memory.dry_run) calls this too. `fault` mmaps, which
    makes llama.cpp abort: only the child honours the test hook."""
    mp = C.llama_model_default_params()
    mp.n_gpu_layers = load.n_gpu_layers
    mp.no_alloc = True
    mp.load_mode = C.LLAMA_LOAD_MODE_MMAP if fault else C.LLAMA_LOAD_MODE_NONE
    mp.use_extra_bufts = load.use_extra_bufts
    model = C.llama_model_load_from_file(load.path.encode(), mp)
    if not model:
        return "model"
    try:
        cp = C.llama_context_default_params()
        cp.n_ctx = load.n_ctx
        cp.n_batch = load.n_batch
        cp.n_ubatch = min(load.n_ubatch, load.n_batch)
        cp.n_seq_max = load.n_seq_max
        cp.n_threads = cp.n_threads_batch = 1
        cp.flash_attn_type = load.flash_attn_type
        cp.type_k = load.type_k
        cp.type_v = load.type_v
        cp.embeddings = load.embeddings
        cp.swa_full = load.swa_full
        cp.kv_unified = load.kv_unified
        ctx = C.llama_init_from_model(model, cp)
        if not ctx:
            return "context"
        C.llama_free(ctx)
        if load.tokenize:
            _tokenize(C, C.llama_model_get_vocab(model))
    finally:
        C.llama_model_free(model)
    return "ok"


def _tokenize(C: Any, vocab: Any) -> None:
    """Round-trip a sample through the tokenizer: a broken vocabulary can abort here."""
    data = SAMPLE_TEXT.encode()
    cap = len(data) + 16
    buf = (C.llama_token * cap)()
    n = C.llama_tokenize(vocab, data, len(data), buf, cap, True, True)
    piece = ctypes.create_string_buffer(256)
    for tok in buf[: max(n, 0)]:
        C.llama_token_to_piece(vocab, tok, piece, len(piece), 0, True)
    for special in (C.llama_vocab_bos(vocab), C.llama_vocab_eos(vocab)):
        if special >= 0:
            C.llama_token_to_piece(vocab, special, piece, len(piece), 0, True)


def main() -> None:
    load = NativeLoad(**json.loads(sys.stdin.read()))
    C = _bindings()
    sys.stdout.write(STARTED + "\n")
    sys.stdout.flush()  # reaches the parent even if llama.cpp aborts the process next
    out = run(load, C)
    sys.stdout.write("\n" + json.dumps(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
