"""The one place that touches llama-cpp-python's ctypes bindings at import time.

Initialises the backend once and routes llama.cpp's global log callback into Python
logging. Code that needs to read what llama.cpp says while it works (the memory dry run,
load errors) opens a `capture_log()` block and gets the lines logged inside it.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import re
import threading
from collections.abc import Iterator
from typing import Any

import llama_cpp.llama_cpp as C

log = logging.getLogger("candlewick.llama")

# ggml_log_level: NONE=0, DEBUG=1, INFO=2, WARN=3, ERROR=4, CONT=5 (continues the last line)
_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_lock = threading.Lock()  # guards the captures and the pending line
# Separate from `_lock`: backend init logs (a CUDA build reports its devices) and the log
# callback takes `_lock`, so holding it during init deadlocks on the first GPU message.
_init_lock = threading.Lock()
_captures: list[list[str]] = []
_pending = ""
_initialised = False


@C.llama_log_callback  # type: ignore[untyped-decorator]
def _on_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    global _pending
    try:
        s = text.decode("utf-8", errors="replace")
    except Exception:  # never let an exception cross back into C
        return
    with _lock:
        # Lines arrive in pieces (level 5 = continuation); emit whole lines only.
        _pending += s
        if "\n" not in _pending:
            return
        *lines, _pending = _pending.split("\n")
        for cap in _captures:
            cap.extend(lines)
    lvl = _LEVELS.get(level, logging.DEBUG)
    for line in lines:
        if line.strip():
            log.log(lvl, "%s", line)


def log_callback() -> Any:
    """The callback that routes a log into Python logging and the captures (libmtmd has
    its own log setter and takes the same one)."""
    return _on_log


def lib() -> Any:
    """The low-level bindings module, with the backend initialised and logs routed."""
    global _initialised
    if not _initialised:
        with _init_lock:
            if not _initialised:
                C.llama_log_set(_on_log, ctypes.c_void_p(0))
                C.llama_backend_init()
                _initialised = True
    return C


def _close_binding_devnull() -> None:
    # llama-cpp-python opens two /dev/null handles at import and never closes them, which
    # shows up as ResourceWarnings at exit; close them when the interpreter ends.
    try:
        from llama_cpp import _utils
    except ImportError:
        return
    for name in ("outnull_file", "errnull_file"):
        f = getattr(_utils, name, None)
        if f is not None:
            atexit.register(f.close)


# At import, not first use: a process that imports the engine and never loads a model (the
# fast test tier, `--help`) would still leave them open.
_close_binding_devnull()


@contextlib.contextmanager
def capture_log() -> Iterator[list[str]]:
    """Collect llama.cpp's log lines emitted while the block runs (from any thread)."""
    lines: list[str] = []
    with _lock:
        _captures.append(lines)
    try:
        yield lines
    finally:
        with _lock:
            _captures.remove(lines)


_system_info: str | None = None


def system_info() -> str:
    global _system_info
    if _system_info is None:
        raw = lib().llama_print_system_info()
        _system_info = bytes(raw).decode("utf-8", errors="replace").strip()
    return _system_info


def supports_gpu_offload() -> bool:
    return bool(lib().llama_supports_gpu_offload())


def amx_build() -> bool:
    """Whether this llama.cpp build has AMX kernels for this CPU."""
    return "AMX_INT8 = 1" in system_info()


# Exported by builds made with installers/llama_cpp/amx_tilecfg.h (`make setup` does that):
# their AMX code was compiled with a correct tile-configuration load.
AMX_MARKER = "candlewick_amx_tilecfg_fixed"


# Exported by the same builds: ggml's f16 vectors are compiled without AVX512-FP16, in
# AVX-512F steps of 64 elements, even on a CPU that has AVX512-FP16 (steps of 128).
F16_AVX512F_MARKER = "candlewick_f16_avx512f_steps"


# Exported by builds made from the patched source (installers/llama_cpp/amx_small_batch.patch,
# `make setup`): AMX weights multiply batches of up to 6 rows (Q4_1; 4 for other
# types) on the vector kernels.
AMX_SMALL_BATCH_MARKER = "candlewick_amx_small_batch"


# Exported by builds made from the patched source (installers/llama_cpp/graph_lanes.patch):
# batches of 2 to 8 tokens keep graphs of their own beside the one-token graph, so a change of
# batch size (a speculative step, a request ending) does not rebuild the graph.
GRAPH_LANES_MARKER = "candlewick_graph_lanes"


# Exported by builds made from the patched source (installers/llama_cpp/flash_attn_small_batch.
# patch): CPU flash attention takes small batches (a decoded token, a verification) in tiles of
# the rows that share a K/V head, so a batch's second row costs little more attention.
FLASH_ATTN_SMALL_TILES_MARKER = "candlewick_flash_attn_small_tiles"
QUANT_COLUMNS_MARKER = "candlewick_quant_cols"


def _exports(symbol: str) -> bool:
    """Whether the loaded libllama (which links ggml's CPU backend) exports `symbol`."""
    loaded = getattr(lib(), "_lib", None)
    if loaded is None:
        return False
    try:
        getattr(loaded, symbol)
    except AttributeError:
        return False
    return True


def amx_kernels_safe() -> bool:
    """Whether the AMX kernels of this build can run multi-token batches.

    Built natively on an AMX CPU by GCC before 13 without the fix above, they fault on the
    first batch of more than one token (the tile configuration is loaded half-written).
    """
    return _exports(AMX_MARKER)


def amx_small_batches() -> bool:
    """Whether this build's AMX code takes its vector kernels for small batches (a 2-token
    verification then costs ~1.1 one-token decodes in the kernels instead of ~1.5)."""
    return _exports(AMX_SMALL_BATCH_MARKER)


def graph_lanes() -> bool:
    """Whether this build keeps small batches' graphs on lanes of their own."""
    return _exports(GRAPH_LANES_MARKER)


def flash_attn_small_tiles() -> bool:
    """Whether this build's CPU flash attention takes small batches in shared K/V tiles."""
    return _exports(FLASH_ATTN_SMALL_TILES_MARKER)


def quant_columns() -> bool:
    """Whether this build's Q4_1 and Q8_0 products read a weight row once for a few tokens."""
    return _exports(QUANT_COLUMNS_MARKER)


def f16_vectors_avx512f() -> bool:
    """Whether this build's f16 vectors step in AVX-512F's 64 elements whatever the CPU."""
    return _exports(F16_AVX512F_MARKER)


# llama.cpp ends a refused load with this line; the reason is on a line before it.
_GENERIC_FAILURES = ("failed to load model",)  # also "... from <path>"
_GGUF_PARSER = "gguf_init_from_file_impl: "
_LOG_SOURCE = re.compile(r"^[A-Za-z_][\w:]*: ")  # "llama_model_load: " before the text


def last_error(lines: list[str]) -> str:
    """llama.cpp's own reason for a failure, from its log: the last error line that says
    more than "failed to load model"."""
    generic = None
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        low = line.lower()
        if line.startswith(_GGUF_PARSER):
            # ggml's GGUF parser logs the cause first, then generic "failed to read ..." lines
            while i > 0 and lines[i - 1].startswith(_GGUF_PARSER):
                i -= 1
            return lines[i].removeprefix(_GGUF_PARSER).strip()
        if "error" in low or "failed" in low or "unknown" in low:
            reason = line.strip()
            # "f: error loading model: g: error loading model hyperparameters: ..." names the
            # callers and says it twice: keep the innermost text
            while (
                shorter := _LOG_SOURCE.sub("", reason, count=1)
                .removeprefix("error loading model: ")
                .strip()
            ) != reason:
                reason = shorter
            if not reason.lower().startswith(_GENERIC_FAILURES):
                return reason
            generic = generic or reason
    return generic or "see the log for details"
