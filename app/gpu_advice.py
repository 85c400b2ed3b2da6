"""Which compute backend this build of llama.cpp has, and how to get GPU offload when it has none.

llama-cpp-python is compiled on install; a plain `pip install` (or a bundle built on a machine
set up that way) is CPU-only even on a machine with a good GPU, and nothing says so. This module
looks at both sides: the backends registered in this llama.cpp build, and the GPUs the operating
system reports (NVML, PCI vendor ids in sysfs, Apple Silicon), and writes advice when they
disagree. Qt-free, so the CLI, the self-test and the window can all show it.
"""

from __future__ import annotations

import contextlib
import ctypes
import platform
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

LLAMA_CPP_VERSION = "0.3.36"

# PCI vendor ids of GPU makers whose cards llama.cpp can offload to.
_PCI_VENDORS = {"0x10de": "NVIDIA", "0x1002": "AMD", "0x8086": "Intel"}
_GPU_BACKENDS = ("CUDA", "Metal", "Vulkan", "ROCm", "HIP", "SYCL", "MUSA", "CANN", "OpenCL")

# What `make setup GPU=...` and a manual pip build use per choice.
CMAKE_ARGS = {
    "cpu": "",
    "cuda": "-DGGML_CUDA=on",
    "metal": "-DGGML_METAL=on",
    "vulkan": "-DGGML_VULKAN=on",
}


@dataclass(frozen=True)
class SystemGpu:
    vendor: str  # NVIDIA | AMD | Intel | Apple
    description: str


@dataclass(frozen=True)
class BackendReport:
    backends: tuple[str, ...]  # ggml backends in this build, e.g. ("CPU",) or ("CUDA", "CPU")
    can_offload: bool
    system_gpus: tuple[SystemGpu, ...] = ()
    frozen: bool = False  # running from a PyInstaller bundle
    advice: tuple[str, ...] = field(default=())

    @property
    def gpu_backends(self) -> tuple[str, ...]:
        return tuple(b for b in self.backends if b in _GPU_BACKENDS)

    @property
    def summary(self) -> str:
        """One line: 'CPU only' or 'GPU offload: CUDA'."""
        if self.can_offload and self.gpu_backends:
            return "GPU offload: " + ", ".join(self.gpu_backends)
        return "CPU only" if not self.can_offload else "GPU offload: " + ", ".join(self.backends)


def build_backends() -> tuple[str, ...]:
    """Names of the backends registered in this llama.cpp (ggml backend registry)."""
    from engine.memory.hardware import ggml_lib
    from engine.native import llama_lib

    llama_lib.lib()  # backends register when llama.cpp initialises
    g = ggml_lib()
    if g is None:
        return ()
    g.ggml_backend_reg_count.restype = ctypes.c_size_t
    g.ggml_backend_reg_get.restype = ctypes.c_void_p
    g.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
    g.ggml_backend_reg_name.restype = ctypes.c_char_p
    g.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    names = []
    for i in range(int(g.ggml_backend_reg_count())):
        raw = g.ggml_backend_reg_name(g.ggml_backend_reg_get(i))
        names.append((raw or b"?").decode(errors="replace"))
    return tuple(names)


def system_gpus(
    sysfs: Path = Path("/sys/class/drm"),
    *,
    platform_name: str | None = None,
    machine: str | None = None,
) -> list[SystemGpu]:
    """GPUs the operating system sees, whatever this llama.cpp build can use."""
    plat = platform_name or sys.platform
    arch = machine or platform.machine()
    if plat == "darwin":
        return [SystemGpu("Apple", "Apple Silicon GPU")] if arch == "arm64" else []
    found: list[SystemGpu] = []
    from engine.memory.hardware import nvml_devices

    with contextlib.suppress(OSError, AttributeError):  # no driver, or an old one
        found += [SystemGpu("NVIDIA", d.description) for d in nvml_devices()]
    if plat.startswith("linux") and sysfs.is_dir():
        for vendor_file in sorted(sysfs.glob("card*/device/vendor")):
            if "-" in vendor_file.parent.parent.name:  # card0-HDMI-A-1: a connector, not a card
                continue
            try:
                vendor = _PCI_VENDORS.get(vendor_file.read_text().strip().lower())
            except OSError:
                continue
            if vendor and not (vendor == "NVIDIA" and any(g.vendor == "NVIDIA" for g in found)):
                found.append(SystemGpu(vendor, f"{vendor} GPU ({vendor_file.parent.parent.name})"))
    return found


def pip_command(choice: str) -> str:
    args = CMAKE_ARGS[choice]
    env = f'CMAKE_ARGS="{args}" ' if args else ""
    # The wheel cache is keyed by version only: without these flags pip reinstalls the cached
    # CPU build and nothing changes.
    return (
        f"{env}pip install --no-cache-dir --force-reinstall --no-deps "
        f"llama-cpp-python=={LLAMA_CPP_VERSION}"
    )


def advise(
    backends: Sequence[str], can_offload: bool, gpus: Sequence[SystemGpu], *, frozen: bool = False
) -> tuple[str, ...]:
    """What to tell the user; empty when the build already matches the machine."""
    if can_offload or not gpus:
        return ()
    vendors = {g.vendor for g in gpus}
    if "NVIDIA" in vendors:
        choice, why = "cuda", "an NVIDIA GPU"
    elif "Apple" in vendors:
        choice, why = "metal", "an Apple Silicon GPU"
    else:
        choice, why = "vulkan", f"{'an AMD' if 'AMD' in vendors else 'an Intel'} GPU"
    lines = [f"This machine has {why}, but this Candlewick build runs llama.cpp on the CPU only."]
    if frozen:
        lines.append(
            "Build a GPU bundle from source: "
            f"`make setup GPU={choice}` then `make dist` (see docs/installers.md)."
        )
    else:
        lines.append(
            f"From a source checkout: `make setup GPU={choice}`; "
            f"in another environment: `{pip_command(choice)}`."
        )
    if choice == "cuda":
        lines.append("A CUDA build needs the CUDA toolkit (nvcc) to compile.")
    elif choice == "vulkan":
        lines.append(
            "A Vulkan build needs the Vulkan SDK or your distribution's "
            "libvulkan-dev and glslc packages to compile."
        )
    return tuple(lines)


def amx_advice(frozen: bool = False) -> tuple[str, ...]:
    """A CPU with AMX and a llama.cpp build whose AMX kernels are unusable (built by GCC < 13
    without the fix header): say how to get them, it is ~2x faster decoding here."""
    from engine.native import llama_lib

    if not llama_lib.amx_build() or llama_lib.amx_kernels_safe():
        return ()
    how = (
        "rebuild the bundle from source with `make setup GPU=cpu` then `make dist`"
        if frozen
        else "rebuild it with `make setup GPU=cpu` (about 5-10 minutes)"
    )
    return (
        "This CPU has AMX, but this llama.cpp build's AMX kernels would crash, so they are "
        f"off and prompts and decoding run on slower kernels; {how}.",
    )


def check() -> BackendReport:
    """This process: the build's backends, the machine's GPUs and the advice."""
    from engine.native import llama_lib

    backends = build_backends()
    can_offload = llama_lib.supports_gpu_offload()
    gpus = tuple(system_gpus())
    frozen = bool(getattr(sys, "frozen", False))
    return BackendReport(
        backends,
        can_offload,
        gpus,
        frozen,
        advise(backends, can_offload, gpus, frozen=frozen) + amx_advice(frozen),
    )
