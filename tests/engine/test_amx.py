"""AMX kernels: the build fix, when the engine uses them, and what they mean for speculation.

GCC before 13 compiles llama.cpp's AMX tile-configuration load so that the CPU faults on it
(installers/llama_cpp/amx_tilecfg.h). Builds made with the header export a marker; the
engine uses the CPU extra buffers (AMX) on an AMX build only when the marker is there.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.errors import EngineError
from engine.host.runtime import Model
from engine.native import llama_lib
from engine.settings import LoadParams, SamplingParams, use_extra_buffers
from tests.backend_batches import decode_at

HEADER = Path(__file__).resolve().parents[2] / "installers" / "llama_cpp" / "amx_tilecfg.h"

# ggml's own tile-configuration load (ggml-cpu/amx/mmq.cpp): a 64-byte struct filled field by
# field, then loaded. Built with the header, in C and in C++ (llama.cpp has both).
PROGRAM = r"""
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>
#include <sys/syscall.h>
struct cfg { uint8_t palette_id, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; };
static void init_tiles(void) {
    struct cfg tc __attribute__((aligned(64))) = {0};
    tc.palette_id = 1;
    tc.rows[0] = 8;  tc.colsb[0] = 64;
    tc.rows[1] = 8;  tc.colsb[1] = 64;
    tc.rows[2] = 16; tc.colsb[2] = 32;
    tc.rows[3] = 16; tc.colsb[3] = 32;
    _tile_loadconfig(&tc);
}
int main(void) {
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */)) return 3;
    init_tiles();
    _tile_release();
    puts("tiles configured");
    return 0;
}
"""


def _cpu_has_amx() -> bool:
    try:
        return " amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.mark.skipif(
    shutil.which("gcc") is None or not _cpu_has_amx(), reason="needs gcc and an AMX CPU"
)
@pytest.mark.parametrize("lang", ["c", "c++"])
def test_header_builds_and_loads_tiles(tmp_path: Path, lang: str) -> None:
    src = tmp_path / ("tiles.c" if lang == "c" else "tiles.cpp")
    src.write_text(PROGRAM)
    exe = tmp_path / "tiles"
    # -march=native as llama.cpp's native build: AMX code only exists with it on this CPU.
    build = subprocess.run(
        [
            "gcc",
            "-x",
            lang,
            "-O3",
            "-march=native",
            "-Werror",
            "-Wall",
            "-rdynamic",
            "-include",
            str(HEADER),
            str(src),
            "-o",
            str(exe),
        ],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0 and "tiles configured" in run.stdout
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", str(exe)], capture_output=True, text=True
    )
    if symbols.returncode == 0:  # the marker the engine looks for is exported
        assert llama_lib.AMX_MARKER in symbols.stdout


@pytest.mark.skipif(not llama_lib.amx_build(), reason="this llama.cpp build has no AMX kernels")
def test_setup_built_usable_amx_kernels() -> None:
    """`make setup` builds llama.cpp with the header, so on an AMX CPU its kernels are usable
    (a venv from before the fix: rerun `make setup`, its llama.cpp stamp is out of date)."""
    assert llama_lib.amx_kernels_safe(), "llama.cpp was built without the AMX fix"


def test_marker_decides_extra_buffers_on_amx_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llama_lib, "amx_build", lambda: True)
    monkeypatch.setattr(llama_lib, "amx_kernels_safe", lambda: False)
    assert use_extra_buffers(None) is False
    assert use_extra_buffers(False) is False
    with pytest.raises(EngineError, match="AMX kernels crash"):
        use_extra_buffers(True)
    monkeypatch.setattr(llama_lib, "amx_kernels_safe", lambda: True)
    assert use_extra_buffers(None) is True
    assert use_extra_buffers(False) is False
    # Without AMX in the build, extra buffers (weight repacking) are on unless refused.
    monkeypatch.setattr(llama_lib, "amx_build", lambda: False)
    monkeypatch.setattr(llama_lib, "amx_kernels_safe", lambda: False)
    assert use_extra_buffers(None) is True and use_extra_buffers(False) is False


def test_marker_lookup_matches_the_loaded_library() -> None:
    loaded = llama_lib.lib()._lib
    try:
        getattr(loaded, llama_lib.AMX_MARKER)
        exported = True
    except AttributeError:
        exported = False
    assert llama_lib.amx_kernels_safe() is exported
    if exported:
        assert ctypes.c_int.in_dll(loaded, llama_lib.AMX_MARKER).value == 1


@pytest.mark.skipif(
    not (llama_lib.amx_build() and llama_lib.amx_kernels_safe()),
    reason="this llama.cpp build has no usable AMX kernels",
)
def test_amx_build_decodes_batches(smollm2_path: Path) -> None:
    """The crash this guards against came on the first multi-token batch: a prompt."""
    m = Model(smollm2_path, LoadParams(n_ctx=512, n_threads=min(2, os.cpu_count() or 1)))
    try:
        assert not m.exactness.exact and "AMX" in m.exactness.reason
        g = m.generate(
            [{"role": "user", "content": "Name three colours of the rainbow."}],
            SamplingParams(temperature=0, max_tokens=12),
        )
        text = g.consume()
        assert g.stats.prompt_tokens > 16 and g.stats.gen_tokens > 0 and text.strip()
    finally:
        m.close()


def test_passing_thread_returns_and_raises() -> None:
    """AMX loads run on a thread that ends (its OpenMP team goes with it, see model_build)."""
    import threading

    from engine.host.model_build import on_passing_thread

    caller = threading.get_ident()
    assert on_passing_thread(threading.get_ident) != caller
    assert on_passing_thread(lambda: 42) == 42

    def boom() -> None:
        raise EngineError("cannot load")

    with pytest.raises(EngineError, match="cannot load"):
        on_passing_thread(boom)


@pytest.mark.skipif(not llama_lib.amx_build(), reason="this llama.cpp build has no AMX kernels")
def test_setup_built_the_small_batch_kernels() -> None:
    """`make setup` builds from the patched source (installers/llama_cpp/amx_small_batch.patch):
    on an AMX CPU small batches take the vector kernels, and the engine drafts by their curve."""
    assert llama_lib.amx_small_batches(), "llama.cpp was built without the small-batch patch"


@pytest.mark.skipif(
    not (llama_lib.amx_build() and llama_lib.amx_small_batches()),
    reason="this llama.cpp build does not take small AMX batches on the vector kernels",
)
def test_small_amx_batches_give_each_row_what_one_token_gives(smollm2_path: Path) -> None:
    """A verification batch of 2 to 6 tokens, every row's logits kept: each row is exactly what
    decoding its token alone gives (the patched kernel does the one-row kernel's arithmetic per
    row), and the 8-token batch, on the tile path, agrees on every row's best token."""
    m = Model(smollm2_path, LoadParams(n_ctx=512, n_threads=min(2, os.cpu_count() or 1)))
    prompt = m.tokenize("The lighthouse keeper found a bottle on the shore, and inside it")
    tail = m.tokenize(" was a letter written in a careful, old-fashioned hand.")[:8]
    p0 = len(prompt)

    def rows(be: Any, tokens: list[int], one_by_one: bool) -> list[Any]:
        out = []
        groups = [[t] for t in tokens] if one_by_one else [tokens]
        pos = p0
        for group in groups:
            decode_at(be, group, pos, True)
            out += [be.logits(i).copy() for i in range(len(group))]
            pos += len(group)
        assert be.seq_rm(0, p0, -1)
        return out

    def run() -> dict[int, tuple[list[Any], list[Any]]]:
        be = m.backend
        assert be is not None and m.amx_weights
        be.clear()
        decode_at(be, prompt, 0, False)
        return {n: (rows(be, tail[:n], False), rows(be, tail[:n], True)) for n in (2, 3, 4, 6, 8)}

    try:
        found = m.loop.call_soon(run)
    finally:
        m.close()
    for n, (batch, single) in found.items():
        assert len(batch) == len(single) == n
        assert [int(r.argmax()) for r in batch] == [int(r.argmax()) for r in single], n
        if n <= 6:
            assert all(np.array_equal(a, b) for a, b in zip(batch, single, strict=True)), n
