"""Adapts `engine.memory.estimate` to what the estimate widget shows.

The panel re-estimates on every slider step, so this uses the analytic method (GGUF header
only, no llama.cpp call) over a header parsed once per file, and the hardware probed once
with the free RAM refreshed each time. engine.memory's tests check the analytic numbers against
real loads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from app.ui.estimate import EstimateView, Verdict
from engine.memory import hardware
from engine.memory.estimate import estimate as estimate_memory
from engine.memory.hardware import CPU
from engine.memory.params import EstimateParams
from engine.memory.result import MemoryEstimate
from engine.model.gguf import GGUFFile, read_gguf
from engine.settings import LoadParams

_VERDICTS: dict[str, Verdict] = {
    "fits_gpu": "fits",
    "ram_only": "fits",
    "partial_offload": "partial",
    "does_not_fit": "no",
}


def to_view(est: MemoryEstimate) -> EstimateView:
    cpu = est.device(CPU)
    gpus = [d for d in est.devices if d.name != CPU]
    free_vram = sum(d.free_bytes or 0 for d in gpus) if gpus else None
    return EstimateView(
        weights=est.weights_bytes,
        kv=est.kv_bytes,
        compute=est.compute_bytes,
        output=est.output_bytes,
        ram=est.ram_bytes,
        vram=est.vram_bytes,
        free_ram=cpu.free_bytes if cpu is not None else None,
        free_vram=free_vram,
        gpu_layers=est.gpu_layers,
        verdict=_VERDICTS.get(est.verdict, "no"),
        reason=est.reason,
        prompt_cache=est.prompt_cache_bytes,
    )


def engine_estimator(
    probe: Callable[[], hardware.Hardware] = hardware.detect,
) -> Callable[[Path, LoadParams], EstimateView]:
    hw_base = probe()
    headers: dict[tuple[str, int, int], GGUFFile] = {}

    def estimate(path: Path, params: LoadParams) -> EstimateView:
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
        gf = headers.get(key)
        if gf is None:
            gf = headers[key] = read_gguf(path)
        _total, avail = hardware.ram()
        hw = dataclasses.replace(hw_base, ram_available_bytes=avail)
        # On the GUI thread as settings change: no child process to size a projector (its
        # weights from its header until a load or an earlier estimate sized it).
        est = estimate_memory(
            gf, EstimateParams(params), hardware=hw, method="analytic", probe_projector=False
        )
        return to_view(est)

    return estimate
