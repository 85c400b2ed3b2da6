"""What the machine has: RAM, GPU devices with their free memory, and whether this build offloads.

GPU devices are asked from llama.cpp's own backend registry (the ggml backend device API,
through ctypes), so CUDA, Metal, Vulkan, ROCm and SYCL builds all answer the same way and the
answer matches what llama.cpp itself will use when it splits layers. NVML is a fallback that
only reports NVIDIA cards (e.g. a CPU-only build on a machine with a GPU: the user learns the
card is there but this build cannot use it).

Devices can be simulated ("one 8 GiB GPU") for tests and for "what if" planning.
"""

from __future__ import annotations

import contextlib
import ctypes
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from engine.memory.cpu_kernels import CpuFeatures

DeviceKind = Literal["gpu", "igpu", "accel"]

# enum ggml_backend_dev_type
_DEV_CPU, _DEV_GPU, _DEV_IGPU, _DEV_ACCEL = 0, 1, 2, 3

GiB = 1 << 30
MiB = 1 << 20
CPU = "CPU"  # the name the estimate and llama.cpp's logs give the host's memory (RAM)


@dataclass(frozen=True)
class Device:
    """A device llama.cpp can put layers on (never the CPU itself: that is `Hardware.ram_*`)."""

    name: str  # llama.cpp's device name, e.g. CUDA0, Metal, Vulkan0
    description: str
    kind: DeviceKind
    free_bytes: int
    total_bytes: int
    simulated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Hardware:
    ram_total_bytes: int
    ram_available_bytes: int
    gpus: tuple[Device, ...] = ()
    can_offload: bool = False  # llama_supports_gpu_offload() of this build (or simulated)
    source: str = "llama.cpp"  # where the GPU list came from: llama.cpp | nvml | simulated | none
    notes: tuple[str, ...] = field(default=())
    # The CPU features whose kernel rules apply (engine.memory.cpu_kernels); None: this build's.
    # Set it to plan for another CPU (an AMX Xeon, an ARM laptop).
    cpu: CpuFeatures | None = None

    @property
    def offload_devices(self) -> tuple[Device, ...]:
        """GPUs that layers can actually go to: none when the build cannot offload."""
        return self.gpus if self.can_offload else ()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gpus"] = [g.to_dict() for g in self.gpus]
        d["notes"] = list(self.notes)
        return d


def ram() -> tuple[int, int]:
    """(total, available) system RAM in bytes; available counts reclaimable page cache."""
    import psutil

    vm = psutil.virtual_memory()
    return int(vm.total), int(vm.available)


def process_rss() -> int:
    """Resident set size of this process in bytes (0 when the platform cannot tell)."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:
        return 0


def ggml_lib() -> ctypes.CDLL | None:
    """The ggml library llama-cpp-python loaded (already in the process, so this is cheap).

    Symbols are looked up through the loaded libllama first: it links ggml, wherever the
    libraries live (`LLAMA_CPP_LIB_PATH` points llama-cpp-python at a separate build, e.g. a
    CUDA one, and then the package's own lib/ folder is empty or holds a different build).
    """
    try:
        import llama_cpp.llama_cpp as C
    except ImportError:
        return None
    loaded = getattr(C, "_lib", None)
    if isinstance(loaded, ctypes.CDLL):
        with contextlib.suppress(AttributeError):
            loaded.ggml_backend_dev_count  # noqa: B018 - probe that the symbol resolves
            return loaded
    libdir = Path(C.__file__).parent / "lib"
    names = (
        "libggml.so",
        "libggml.dylib",
        "ggml.dll",
        "libggml-base.so",
        "libggml-base.dylib",
        "ggml-base.dll",
    )
    for name in names:
        p = libdir / name
        if p.exists():
            try:
                lib = ctypes.CDLL(str(p))
                lib.ggml_backend_dev_count  # noqa: B018 - probe that the symbol exists
            except (OSError, AttributeError):
                continue
            return lib
    return None


def llama_devices() -> list[Device]:
    """GPU-like devices registered in llama.cpp's backend registry, with free/total memory."""
    from engine.native import llama_lib

    llama_lib.lib()  # backends register when llama.cpp initialises
    g = ggml_lib()
    if g is None:
        return []
    g.ggml_backend_dev_count.restype = ctypes.c_size_t
    g.ggml_backend_dev_get.restype = ctypes.c_void_p
    g.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    g.ggml_backend_dev_name.restype = ctypes.c_char_p
    g.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
    g.ggml_backend_dev_description.restype = ctypes.c_char_p
    g.ggml_backend_dev_description.argtypes = [ctypes.c_void_p]
    g.ggml_backend_dev_type.restype = ctypes.c_int
    g.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    g.ggml_backend_dev_memory.restype = None
    g.ggml_backend_dev_memory.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(ctypes.c_size_t),
    ]
    kinds: dict[int, DeviceKind] = {_DEV_GPU: "gpu", _DEV_IGPU: "igpu"}
    out: list[Device] = []
    for i in range(int(g.ggml_backend_dev_count())):
        dev = g.ggml_backend_dev_get(i)
        kind = kinds.get(int(g.ggml_backend_dev_type(dev)))
        if kind is None:  # the CPU and CPU accelerators (BLAS, AMX) hold no layers of their own
            continue
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        g.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append(
            Device(
                name=(g.ggml_backend_dev_name(dev) or b"?").decode(errors="replace"),
                description=(g.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
                kind=kind,
                free_bytes=int(free.value),
                total_bytes=int(total.value),
            )
        )
    return out


class _NvmlMemory(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


def nvml_devices() -> list[Device]:
    """NVIDIA GPUs through NVML, or [] when there is no driver."""
    lib = None
    for name in ("libnvidia-ml.so.1", "nvml.dll"):
        with contextlib.suppress(OSError):
            lib = ctypes.CDLL(name)
            break
    if lib is None or lib.nvmlInit_v2() != 0:
        return []
    out: list[Device] = []
    try:
        count = ctypes.c_uint(0)
        if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return []
        for i in range(count.value):
            handle = ctypes.c_void_p()
            if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
                continue
            mem = _NvmlMemory()
            if lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)) != 0:
                continue
            buf = ctypes.create_string_buffer(96)
            lib.nvmlDeviceGetName(handle, buf, len(buf))
            out.append(
                Device(
                    f"CUDA{i}",
                    buf.value.decode(errors="replace"),
                    "gpu",
                    int(mem.free),
                    int(mem.total),
                )
            )
    finally:
        lib.nvmlShutdown()
    return out


def detect() -> Hardware:
    """The real machine: RAM, llama.cpp's GPU devices (NVML as a fallback), offload support."""
    from engine.native import llama_lib

    total, avail = ram()
    can_offload = llama_lib.supports_gpu_offload()
    notes: list[str] = []
    gpus = llama_devices()
    source = "llama.cpp" if gpus else "none"
    if not gpus:
        gpus = nvml_devices()
        if gpus:
            source = "nvml"
            if not can_offload:
                notes.append(
                    "this llama.cpp build cannot offload to a GPU (a CPU-only build); "
                    "install a CUDA build to use the GPU"
                )
    return Hardware(total, avail, tuple(gpus), can_offload, source, tuple(notes))


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str, *, allow_zero: bool = False) -> int:
    """'8GiB', '8G', '0.2 GiB', '512MiB', '24gb' -> bytes (binary units: GPUs report GiB)."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"cannot read {text!r} as a memory size (try 8GiB or 512MiB)")
    value = float(m.group(1))
    scale = {"": 1, "k": 1 << 10, "m": MiB, "g": GiB, "t": 1 << 40}[m.group(2).lower()]
    if m.group(2) == "" and not m.group(3):
        scale = GiB  # a bare number means GiB: nobody has a GPU measured in bytes
    n = int(value * scale)
    if n < 0 or (n == 0 and not allow_zero):
        raise ValueError(f"a memory size must be more than 0, not {text!r}")
    return n


def simulate(
    gpu_sizes: Sequence[int], base: Hardware | None = None, *, ram_bytes: int | None = None
) -> Hardware:
    """`base` (default: this machine's RAM) with these GPUs instead of the real ones.

    Simulated GPUs are empty (free = total) and offload is assumed possible, which is what a
    "what if I had a 24 GiB card" question means.
    """
    if base is None:
        total, avail = ram()
        base = Hardware(total, avail)
    gpus = tuple(
        Device(f"GPU{i}", f"simulated {size / GiB:.3g} GiB GPU", "gpu", size, size, simulated=True)
        for i, size in enumerate(gpu_sizes)
    )
    hw = replace(
        base,
        gpus=gpus,
        can_offload=bool(gpus) or base.can_offload,
        source="simulated" if gpus else base.source,
    )
    if ram_bytes is not None:
        hw = replace(hw, ram_total_bytes=ram_bytes, ram_available_bytes=ram_bytes)
    return hw


def cpu_only(ram_bytes: int | None = None) -> Hardware:
    """This machine (or a given amount of RAM) with no GPU at all."""
    if ram_bytes is None:
        total, avail = ram()
        return Hardware(total, avail)
    return Hardware(ram_bytes, ram_bytes)
