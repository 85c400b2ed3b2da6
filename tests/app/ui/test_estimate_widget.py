"""The library panel's memory estimate on the real SmolLM2 header: what the breakdown says of
the RAM prompt cache, which is RAM the fit counts but not one of llama.cpp's buffers."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot

from app.ui.estimate import EstimateWidget
from app.ui.memory_adapter import engine_estimator
from engine.memory.hardware import GiB, MiB, cpu_only
from engine.settings import LoadParams


def test_the_prompt_cache_is_shown_beside_the_ram_it_may_take(
    qtbot: QtBot, smollm2_path: Path
) -> None:
    widget = EstimateWidget(engine_estimator(lambda: cpu_only(8 * GiB)))
    qtbot.addWidget(widget)
    params = LoadParams(n_ctx=1024, n_gpu_layers=0)
    on = widget.update_for(smollm2_path, params)
    assert on is not None and on.prompt_cache == params.state_cache_mb * MiB
    text = widget.placement.text()
    assert f"RAM {_mib(on.ram)} + prompt cache ≤ {_mib(on.prompt_cache)} of " in text, text
    off = widget.update_for(smollm2_path, LoadParams(n_ctx=1024, n_gpu_layers=0, state_cache_mb=0))
    assert off is not None and off.prompt_cache == 0
    # Not a llama.cpp buffer: the total (compared with what a load allocates) is the same.
    assert off.total == on.total and off.ram == on.ram
    assert "prompt cache" not in widget.placement.text()


def _mib(n: int) -> str:
    return f"{n / MiB:.1f} MiB"
