"""Start llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server`) safely here.

Same arguments as `python -m llama_cpp.server`. The only change: on llama.cpp builds whose AMX
kernels crash on multi-token batches (built by GCC < 13 without Candlewick's fix header, see the
README), weight repacking ("extra buffer types") is switched off before the model loads: the
same rule `engine.host.runtime.use_extra_buffers` applies to Candlewick's own engine. The benchmark
tests and the published comparison run llama_cpp.server through this wrapper.
"""

from __future__ import annotations

import sys
from typing import Any

import llama_cpp.llama_cpp as C

from engine.native.llama_lib import AMX_MARKER


def _patch_extra_buffers() -> None:
    info = bytes(C.llama_print_system_info()).decode("utf-8", errors="replace")
    if "AMX_INT8 = 1" not in info or hasattr(C._lib, AMX_MARKER):
        return
    original = C.llama_model_default_params

    def default_params() -> Any:
        params = original()
        params.use_extra_bufts = False
        return params

    C.llama_model_default_params = default_params


def main() -> None:
    _patch_extra_buffers()
    from llama_cpp.server.__main__ import main as server_main

    sys.argv[0] = "llama_cpp.server"
    server_main()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
