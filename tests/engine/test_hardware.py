"""Hardware detection: RAM, llama.cpp's devices, offload support, simulated GPUs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from engine.memory import hardware
from engine.memory.hardware import GiB, MiB
from engine.native import llama_lib


def test_detect_reports_this_machine() -> None:
    hw = hardware.detect()
    vm = psutil.virtual_memory()
    assert hw.ram_total_bytes == vm.total
    assert 0 < hw.ram_available_bytes <= hw.ram_total_bytes
    assert hw.can_offload == llama_lib.supports_gpu_offload()
    if not hw.can_offload:
        assert hw.offload_devices == ()
    d = hw.to_dict()
    assert d["ram_total_bytes"] == vm.total and isinstance(d["gpus"], list)


def test_llama_devices_match_the_build() -> None:
    devices = hardware.llama_devices()
    # The CPU is never listed as a device for layers; a CPU-only build lists no GPU at all.
    assert all(d.kind in ("gpu", "igpu") for d in devices)
    if not llama_lib.supports_gpu_offload():
        assert devices == []
    for d in devices:
        assert 0 <= d.free_bytes <= d.total_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8GiB", 8 * GiB),
        ("8G", 8 * GiB),
        ("8gb", 8 * GiB),
        ("0.2 GiB", int(0.2 * GiB)),
        ("512MiB", 512 * MiB),
        ("512M", 512 * MiB),
        ("24", 24 * GiB),
        ("1T", 1 << 40),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert hardware.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-1G", "0", "8 XB", "1.2.3G"])
def test_parse_size_rejects_nonsense(text: str) -> None:
    with pytest.raises(ValueError, match="memory size"):
        hardware.parse_size(text)


def test_simulated_gpus() -> None:
    base = hardware.cpu_only(16 * GiB)
    hw = hardware.simulate([8 * GiB, 24 * GiB], base)
    assert hw.can_offload and hw.source == "simulated"
    assert [g.name for g in hw.offload_devices] == ["GPU0", "GPU1"]
    assert all(g.simulated and g.free_bytes == g.total_bytes for g in hw.gpus)
    assert hw.ram_available_bytes == 16 * GiB
    assert hardware.simulate([], base, ram_bytes=GiB).ram_available_bytes == GiB


def test_process_rss_follows_real_allocations() -> None:
    import mmap

    # Fresh anonymous pages, written so that they are resident (a heap allocation may
    # reuse pages an earlier test freed and the allocator kept, leaving the RSS as it was).
    with mmap.mmap(-1, 64 * MiB) as block:
        before = hardware.process_rss()
        block.write(b"\x01" * (64 * MiB))
        after = hardware.process_rss()
    assert after - before >= 60 * MiB


def test_devices_come_from_the_llama_cpp_actually_loaded(tmp_path: Path) -> None:
    """With LLAMA_CPP_LIB_PATH (a separate CUDA build, say) the package's own lib/ folder holds
    another build or nothing: the device list must come from the libraries really loaded."""
    import llama_cpp

    libdir = Path(llama_cpp.__file__).parent / "lib"
    other = tmp_path / "build"
    shutil.copytree(libdir, other, symlinks=True)
    code = (
        "from engine.memory import hardware; g = hardware.ggml_lib(); print(g._name); "
        "print(len(hardware.llama_devices()))"
    )
    env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(other)}
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert Path(out[0]).parent == other
