"""How much memory a model will take, where it goes, and whether it fits — before loading it.

Two methods, both kept (docs/memory.md explains the model and shows estimate vs actual):

* **dry run** (`engine.memory.dry_run`; local files; on builds that can offload only when asked
  for, in a child process): llama.cpp logs the sizes of the buffers it would allocate.
* **analytic** (`engine.memory.analytic`, from GGUF metadata alone: remote files, and a
  cross-check): weights per tensor from the tensor table (`engine.memory.model_spec`), the KV
  cache, output and compute buffers by formula.

Either feeds the placement (`engine.memory.placement`: layers over devices, the fit check and the
verdict). `total_bytes` is what llama.cpp itself allocates (the sum of its buffers, the number a
real load logs; `engine.memory.actual` reads that log after a load).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Literal

from engine.errors import EngineError
from engine.memory import cpu_kernels, projector
from engine.memory.dry_run import DryRun, dry_run
from engine.memory.hardware import Hardware, MiB
from engine.memory.hardware import detect as detect_hardware
from engine.memory.model_spec import ModelSpec
from engine.memory.params import EstimateParams
from engine.memory.placement import extra_copies_bytes, fit_context, layer_devices, plan
from engine.memory.result import MemoryEstimate, Method, gb
from engine.model.facts import embedding_pooling
from engine.model.gguf import GGUFFile, merge_splits, read_gguf, split_count, split_names
from engine.model.projector_file import check_projector
from engine.model.semantics import check_model
from engine.native import llama_lib
from engine.native.load_probe import ProjectorSizes
from engine.native.lora import adapter_tensor_bytes

Source = str | os.PathLike[str] | GGUFFile


def _load(source: Source) -> tuple[GGUFFile, Path | None]:
    if isinstance(source, GGUFFile):
        return source, None
    path = Path(source)
    gf = read_gguf(path)
    names = split_names(path.name, split_count(gf))
    if names:
        # The first part holds the metadata; the others hold the rest of the tensor table.
        gf = merge_splits([gf if n == path.name else read_gguf(path.with_name(n)) for n in names])
    return gf, path


def estimate(
    source: Source,
    params: EstimateParams | None = None,
    *,
    hardware: Hardware | None = None,
    method: Method | Literal["auto"] = "auto",
    path: str | os.PathLike[str] | None = None,
    probe_projector: bool = True,
) -> MemoryEstimate:
    """Estimate memory for a model (a path, or a parsed header) with these settings.

    `hardware` defaults to this machine (`engine.memory.hardware.detect()`); pass a simulated
    one for "what if" planning. `method='auto'` dry-runs local files and falls back to the analytic
    model for headers without a file (remote) or architectures llama.cpp cannot size.
    `probe_projector` False: a projector not sized in this process yet counts its weights
    only (no child process is started: an estimate redrawn as a slider moves).
    """
    p = params or EstimateParams()
    p.validate()
    gf, file_path = _load(source)
    check_model(gf)  # the dry run loads the file into llama.cpp
    if path is not None:
        file_path = Path(path)
    hw = hardware if hardware is not None else detect_hardware()
    # Plan with flash attention as the engine would resolve 'auto' on this hardware.
    flash = cpu_kernels.resolve_flash_attn_for(
        p.load.flash_attn,
        gf,
        p.load.type_k,
        p.load.type_v,
        n_ctx=p.load.n_ctx,
        n_seq_max=p.load.n_seq_max,
        gpu=bool(hw.offload_devices),
    )
    p = p.with_load(flash_attn=flash)
    if embedding_pooling(gf) > 0:
        p = p.with_load(state_cache_mb=0)  # an embedding model keeps no prompts: none generate
    spec = ModelSpec.from_gguf(gf, hw.cpu)
    notes: list[str] = []
    if method == "dry-run" and file_path is None:
        raise EngineError("a dry run needs the model file on disk; use the analytic method")
    dry: DryRun | None = None
    # On a GPU build 'auto' is analytic: the dry run sizes the CPU graph and adds llama.cpp's
    # GPU op-offload buffer on top (twice the real compute buffer on an H200), while the
    # analytic model matched the CUDA buffers (docs/gpu.md); and it needs a child process.
    if file_path is not None and (
        method == "dry-run" or (method == "auto" and not llama_lib.supports_gpu_offload())
    ):
        try:
            dry = dry_run(file_path, p)
        except EngineError as e:
            if method == "dry-run":
                raise
            # e.g. an architecture newer than this llama.cpp: the header still tells a lot.
            notes.append(f"llama.cpp could not size this model ({e}); analytic estimate")
    if spec.n_ctx_train and p.load.n_ctx > spec.n_ctx_train:
        notes.append(
            f"the context ({p.load.n_ctx}) is longer than the model was trained for "
            f"({spec.n_ctx_train}); quality may drop beyond that"
        )
    if split_count(gf) > 1 and len(gf.tensors) < int(
        gf.metadata.get("split.tensors.count", 0) or 0
    ):
        notes.append("only part of a split model was read; weights are under-counted")
    if dry is None and spec.recurrent:
        notes.append(
            f"{spec.architecture} keeps a recurrent state that the analytic model "
            "does not cover; download the file for an exact dry run"
        )
    sized = _with_loras(_projector(file_path, p, notes, probe_projector), p, notes)
    est = plan(spec, p, hw, dry, notes, sized)
    copies = extra_copies_bytes(
        spec, p, layer_devices(spec.n_layer, est.gpu_layers, hw.offload_devices)
    )
    if copies:
        est = replace(
            est,
            notes=(
                *est.notes,
                f"the weights include llama.cpp's "
                f"{' and '.join(spec.copy_buffers)} copy of the CPU layers' "
                f"matrices ({gb(copies)}), next to the mapped file",
            ),
        )
    if not est.fits and est.max_ctx_fit is None:
        est = replace(est, max_ctx_fit=fit_context(spec, p, hw, dry))
        if est.max_ctx_fit:
            est = replace(
                est, reason=est.reason + f"; a context of {est.max_ctx_fit} tokens would fit"
            )
    return est


def _with_loras(
    sized: ProjectorSizes | None, p: EstimateParams, notes: list[str]
) -> ProjectorSizes | None:
    """The RAM beside llama.cpp's model buffers with the LoRA adapters' tensors added: an
    adapter of a CPU model is allocated in RAM next to the weights (its file's tensor bytes)."""
    if not p.load.loras:
        return sized
    extra = sum(adapter_tensor_bytes(path) for path, _ in p.load.loras)
    n = len(p.load.loras)
    notes.append(f"RAM includes {n} LoRA adapter{'s' * (n > 1)}: {extra / MiB:.1f} MiB of tensors")
    if sized is None:
        return ProjectorSizes(extra, 0)
    return ProjectorSizes(sized.weights_bytes + extra, sized.compute_bytes)


def _projector(
    file_path: Path | None, p: EstimateParams, notes: list[str], probe: bool
) -> ProjectorSizes | None:
    """The projector's RAM, when the load has one: as sized before in this process, else
    sized in a child (`probe`, engine.memory.projector), else its weights from its header."""
    if not p.load.mmproj:
        return None
    name = Path(p.load.mmproj).name
    sizes = projector.known(p.load.mmproj)
    if sizes is None and probe and file_path is not None:
        sizes = projector.projector_memory(file_path, check_projector(p.load.mmproj).path)
    if sizes is None:
        weights = projector.header_weights(p.load.mmproj)
        notes.append(
            f"RAM includes the projector {name}'s {weights / MiB:.1f} MiB of weights; its "
            "compute buffer is sized when it first loads"
        )
        return ProjectorSizes(weights, 0)
    notes.append(
        f"RAM includes the projector {name}: {sizes.weights_bytes / MiB:.1f} MiB of weights "
        f"and {sizes.compute_bytes / MiB:.1f} MiB of compute buffer"
    )
    return sizes


def fit_gpu_layers(source: Source, params: EstimateParams, hardware: Hardware) -> int:
    """GPU layer count for `n_gpu_layers='auto'`: the most that fit in the devices' free memory
    minus the margin (analytic, so it adds no dry run to every load)."""
    gf, _ = _load(source)
    est = plan(
        ModelSpec.from_gguf(gf, hardware.cpu),
        params.with_load(n_gpu_layers="auto"),
        hardware,
        None,
        [],
    )
    return est.gpu_layers
