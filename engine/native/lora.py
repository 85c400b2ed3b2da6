"""LoRA adapters (GGUF files of llama.cpp's "adapter" type) loaded on a model's weights.

An adapter is loaded once with its model and stays until the model is freed; which adapters a
decode applies, and at what scale, is the context's setting (`LlamaBackend.apply_lora`), so one
loaded model serves requests with any mix of scales, never two mixes in one batch."""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf

from engine.errors import EngineError
from engine.native import llama_lib

BUFFER_LINE = re.compile(r"(\S+) LoRA buffer size =\s*([\d.]+) MiB")


@dataclass(frozen=True)
class LoraAdapter:
    """One loaded adapter: its index (the id clients name), file, llama.cpp handle and
    the bytes of its tensors (allocated beside the model's weights)."""

    id: int
    path: Path
    ptr: Any
    tensor_bytes: int
    task_name: str = ""  # adapter.lora.task_name, adapter.lora.prompt_prefix: llama-server's
    prompt_prefix: str = ""
    # What llama.cpp allocated for it, by buffer type (its log's "LoRA buffer size" lines).
    buffers: dict[str, int] = field(default_factory=dict)


def adapter_tensor_bytes(path: str | Path) -> int:
    """What an adapter's tensors take once loaded (their sizes in the file), or EngineError in
    one line when it is no GGUF LoRA adapter."""
    return sum(int(t.n_bytes) for t in _reader(path).tensors)


def _text(reader: gguf.GGUFReader, key: str) -> str:
    field = reader.fields.get(key)
    return str(field.contents()) if field is not None else ""


def _reader(path: str | Path) -> gguf.GGUFReader:
    try:
        reader = gguf.GGUFReader(path)
    except (OSError, ValueError) as e:
        raise EngineError(f"{Path(path).name} is not a readable GGUF file: {e}") from None
    kind = reader.fields.get("general.type")
    if kind is None or str(kind.contents()) != "adapter":
        raise EngineError(
            f"{Path(path).name} is not a LoRA adapter (general.type is not 'adapter')"
        )
    return reader


def load_loras(model_ptr: Any, specs: tuple[tuple[str, float], ...]) -> list[LoraAdapter]:
    """Load each adapter of (path, scale) `specs` onto `model_ptr`; EngineError naming the
    file llama.cpp refused (the adapters loaded before it are freed with the model)."""
    C = llama_lib.lib()
    out: list[LoraAdapter] = []
    for i, (path, _) in enumerate(specs):
        reader = _reader(path)
        size = sum(int(t.n_bytes) for t in reader.tensors)
        with llama_lib.capture_log() as lines:
            ptr = C.llama_adapter_lora_init(model_ptr, str(path).encode())
        if not ptr:
            why = llama_lib.last_error(lines)
            raise EngineError(f"llama.cpp could not load the LoRA adapter {Path(path).name}: {why}")
        task = _text(reader, "adapter.lora.task_name")
        prefix = _text(reader, "adapter.lora.prompt_prefix")
        buffers: dict[str, int] = {}
        for m in filter(None, map(BUFFER_LINE.search, lines)):
            buffers[m.group(1)] = buffers.get(m.group(1), 0) + round(float(m.group(2)) * 2**20)
        out.append(LoraAdapter(i, Path(path), ptr, size, task, prefix, buffers))
    return out


def set_adapters(ctx: Any, adapters: list[LoraAdapter], scales: tuple[float, ...]) -> None:
    """Make the context apply `adapters` at `scales` (a scale of 0 leaves one out, as
    llama-server does); EngineError when llama.cpp refuses."""
    C = llama_lib.lib()
    used = [(a.ptr, s) for a, s in zip(adapters, scales, strict=True) if s != 0.0]
    ptrs = (C.llama_adapter_lora_p_ctypes * max(len(used), 1))(*(p for p, _ in used))
    vals = (ctypes.c_float * max(len(used), 1))(*(s for _, s in used))
    if C.llama_set_adapters_lora(ctx, ptrs, len(used), vals) != 0:
        raise EngineError("llama.cpp refused the LoRA adapters' scales")
