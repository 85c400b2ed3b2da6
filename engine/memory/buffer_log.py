"""The buffer sizes llama.cpp logs while it loads a model and creates a context.

The dry run reads the sizes it would allocate; a real load reads what it did allocate.
"""

from __future__ import annotations

import re

from engine.memory.hardware import CPU, MiB

BUFFER_LINE = re.compile(r"(\S+)\s+(model|KV|RS|compute|output) buffer size =\s*([\d.]+) MiB")
CACHE_SIZE_LINE = re.compile(r"^(llama_kv_cache|llama_memory_recurrent)\S*: size =\s*([\d.]+) MiB")
BUFFER_KIND = {"model": "weights", "KV": "kv", "RS": "kv", "compute": "compute", "output": "output"}


def device_of(buffer_name: str) -> str:
    """Buffer type -> the memory it lives in: CPU_Mapped, CPU_REPACK, AMX, CUDA_Host -> CPU."""
    if buffer_name.startswith(("CPU", "AMX")) or buffer_name.endswith("_Host"):
        return CPU
    return buffer_name.removesuffix("_Mapped")


def mib(text: str) -> int:
    return round(float(text) * MiB)
