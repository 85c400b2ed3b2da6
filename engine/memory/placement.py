"""Placement: which device each layer goes to, what each device then holds, and the verdict.

Layers are split over devices as this llama.cpp does it: the output layer is offloaded first,
the input embedding always stays on the CPU, GPUs share the offloaded layers in proportion to
their free memory. `overhead_bytes` is extra the runtime needs outside llama.cpp's buffers (a
GPU driver context on each GPU used; on the CPU, the prompt cache's budget in RAM) and only
enters the fit check: `bytes` stays what llama.cpp allocates, the figure a real load is
compared with.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from engine.memory.analytic import (
    CTX_PAD,
    compute_phases,
    graph_lanes_share,
    kv_bytes_per_layer,
    mask_bytes,
    output_buffer_bytes,
    pad,
    shape,
)
from engine.memory.dry_run import DryRun
from engine.memory.hardware import CPU, Device, Hardware, MiB
from engine.memory.model_spec import ModelSpec, extra_copies
from engine.memory.params import EstimateParams, default_margin
from engine.memory.result import DeviceUse, MemoryEstimate, Verdict, gb
from engine.native.load_probe import ProjectorSizes

# GPU memory a process uses outside llama.cpp's buffers once it has loaded a model: cuBLAS
# handles and workspace, the CUDA memory pool, graphs. Measured on an H200 (CUDA 13,
# docs/gpu.md): 15-125 MiB per model plus 68 MiB kept after the first one. The CUDA context
# itself (527 MiB there) is not counted: detecting the GPU creates it, so the free memory the
# plan starts from is already net of it.
GPU_RUNTIME_OVERHEAD = 300 * MiB


def layer_devices(n_layer: int, n_gpu_layers: int, gpus: Sequence[Device]) -> list[str]:
    """Device of each repeating layer and (last item) of the output layer, as llama.cpp assigns
    them: `i_gpu_start = max(n_layer + 1 - n_gpu_layers, 0)`; GPUs split by free memory."""
    if not gpus or n_gpu_layers <= 0:
        return [CPU] * (n_layer + 1)
    free = [float(g.free_bytes) for g in gpus]
    if not any(free):
        free = [1.0] * len(gpus)
    total = sum(free)
    splits, acc = [], 0.0
    for f in free:
        acc += f
        splits.append(acc / total)
    start = max(n_layer + 1 - n_gpu_layers, 0)
    act = min(n_gpu_layers, n_layer + 1)
    out = []
    for il in range(n_layer + 1):
        if il < start or il - start >= act:
            out.append(CPU)
        else:
            k = bisect.bisect_right(splits, (il - start) / act)
            out.append(gpus[min(k, len(gpus) - 1)].name)
    return out


def extra_copies_bytes(spec: ModelSpec, p: EstimateParams, where: Sequence[str]) -> int:
    """Bytes of the extra-buffer copies a load makes with this layer placement (only CPU
    layers are copied; 0 with extra buffers off)."""
    if not extra_copies(p):
        return 0
    n = sum(b for il, b in enumerate(spec.copy_layer_bytes) if where[il] == CPU)
    return n + (spec.copy_output_bytes if where[-1] == CPU else 0)


def plan(
    spec: ModelSpec,
    p: EstimateParams,
    hw: Hardware,
    dry: DryRun | None,
    notes: list[str],
    projector: ProjectorSizes | None = None,
) -> MemoryEstimate:
    """Place the model's buffers on the devices for `p` (`projector`: a multimodal
    projector's weights and compute buffer, which libmtmd keeps in RAM on a CPU build)."""
    gpus = hw.offload_devices
    n_layers = spec.n_layer + 1
    kv_layers = kv_bytes_per_layer(spec, p)
    out_phase, layer_phase = compute_phases(spec, p)
    output = output_buffer_bytes(spec, p)
    if dry is not None:
        # Trust llama.cpp's own sizes where they differ from the formula by more than the
        # log's rounding (2 decimals of MiB); keep the per-layer shape of the KV cache.
        analytic_kv = sum(kv_layers)
        if not _same(analytic_kv, dry.kv_bytes, 2):
            if analytic_kv:
                kv_layers = [k * dry.kv_bytes // analytic_kv for k in kv_layers]
            else:
                kv_layers = [dry.kv_bytes // max(spec.n_layer, 1)] * spec.n_layer
        measured = sum(dry.compute.values())
        if measured:
            scale = measured / max(out_phase, layer_phase, 1)
            out_phase, layer_phase = int(out_phase * scale), int(layer_phase * scale)
        if dry.output and not _same(output, sum(dry.output.values()), len(dry.output)):
            output = sum(dry.output.values())

    def place(ngl: int) -> tuple[DeviceUse, ...]:
        return _place(spec, p, hw, gpus, ngl, kv_layers, out_phase, layer_phase, output, projector)

    req = p.load.n_gpu_layers
    if not gpus:
        ngl = 0
    elif req == "all":
        ngl = n_layers
    elif req == "auto":
        ngl = 0
        for n in range(n_layers, -1, -1):
            if all(d.fits for d in place(n) if d.name != CPU):
                ngl = n
                break
    else:
        ngl = min(int(req), n_layers)
    devices = place(ngl)
    verdict, reason = _verdict(spec, p, hw, devices, ngl, n_layers)
    return MemoryEstimate(
        model=spec.name,
        method="dry-run" if dry is not None else "analytic",
        params=p,
        n_ctx=shape(spec, p).n_ctx,
        weights_bytes=sum(d.weights_bytes for d in devices),
        kv_bytes=sum(d.kv_bytes for d in devices),
        compute_bytes=sum(d.compute_bytes for d in devices),
        output_bytes=sum(d.output_bytes for d in devices),
        overhead_bytes=sum(d.overhead_bytes for d in devices),
        devices=devices,
        gpu_layers=ngl,
        n_layers=n_layers,
        verdict=verdict,
        reason=reason,
        notes=tuple(notes),
    )


def _same(exact: int, logged: int, n_values: int) -> bool:
    """Whether a size llama.cpp logged (rounded to 0.01 MiB per value) matches `exact`."""
    return abs(exact - logged) <= n_values * 0.005 * MiB + 1


def _place(
    spec: ModelSpec,
    p: EstimateParams,
    hw: Hardware,
    gpus: Sequence[Device],
    ngl: int,
    kv_layers: Sequence[int],
    out_phase: int,
    layer_phase: int,
    output: int,
    projector: ProjectorSizes | None = None,
) -> tuple[DeviceUse, ...]:
    where = layer_devices(spec.n_layer, ngl, gpus)
    names = [CPU] + [g.name for g in gpus]
    w = dict.fromkeys(names, 0)
    kv = dict.fromkeys(names, 0)
    comp = dict.fromkeys(names, 0)
    layers = dict.fromkeys(names, 0)
    w[CPU] += spec.input_bytes  # the input embedding always stays on the CPU
    # With extra buffers, the matrices of CPU layers get a repacked copy besides the file.
    w[CPU] += extra_copies_bytes(spec, p, where)
    for il in range(spec.n_layer):
        w[where[il]] += spec.layer_bytes[il]
        kv[where[il]] += kv_layers[il]
        layers[where[il]] += 1
    out_dev = where[-1]
    layers[out_dev] += 1
    w[out_dev] += spec.output_bytes
    if out_dev != CPU:
        w[out_dev] += spec.tied_output_bytes  # a tied output matrix is copied to the GPU
    if out_dev == CPU:
        comp[CPU] = max(out_phase, layer_phase)
    else:
        # The graph runs where the layers are. The attention mask (micro-batch x context) is
        # an input built in host memory and copied to the GPU, where the copy lives through
        # the output phase; the host also stages the input embedding. Measured on an H200
        # (docs/gpu.md): 1 GiB on each side at a context of 1M tokens.
        mask = mask_bytes(spec, p)
        comp[out_dev] = max(out_phase + mask, layer_phase)
        for name in names:
            if name != out_dev and layers[name]:
                comp[name] = max(comp[name], layer_phase)
        comp[CPU] = max(comp[CPU], 2 * 4 * shape(spec, p).n_ubatch * spec.n_embd + mask)
    lanes = graph_lanes_share(spec, p)
    for name in names:
        comp[name] += int(comp[name] * lanes)
    if projector is not None:  # its own graph and buffers, beside llama.cpp's
        w[CPU] += projector.weights_bytes
        comp[CPU] += projector.compute_bytes
    out: list[DeviceUse] = []
    cpu_margin = (
        p.margin_bytes if p.margin_bytes is not None else default_margin(hw.ram_total_bytes)
    )
    out.append(
        DeviceUse(
            CPU,
            "cpu",
            w[CPU],
            kv[CPU],
            comp[CPU],
            output,
            # Saved prompt states may grow to their budget while the model is loaded.
            p.prompt_cache_bytes,
            layers[CPU],
            hw.ram_available_bytes,
            cpu_margin,
        )
    )
    for g in gpus:
        used = layers[g.name] > 0
        margin = p.margin_bytes if p.margin_bytes is not None else default_margin(g.total_bytes)
        out.append(
            DeviceUse(
                g.name,
                g.kind,
                w[g.name],
                kv[g.name],
                comp[g.name],
                0,
                GPU_RUNTIME_OVERHEAD if used else 0,
                layers[g.name],
                g.free_bytes,
                margin,
                g.simulated,
            )
        )
    return tuple(out)


def _verdict(
    spec: ModelSpec,
    p: EstimateParams,
    hw: Hardware,
    devices: Sequence[DeviceUse],
    ngl: int,
    n_layers: int,
) -> tuple[Verdict, str]:
    for d in devices:
        if not d.fits:
            where = "RAM" if d.name == CPU else d.name
            cache = p.prompt_cache_bytes if d.name == CPU else 0
            with_cache = f"; with up to {gb(cache)} of prompt cache" if cache else ""
            return "does_not_fit", (
                f"needs {gb(d.bytes + d.overhead_bytes)} of {where} but only "
                f"{gb(d.free_bytes or 0)} is free (keeping {gb(d.margin_bytes)} spare"
                f"{with_cache})"
            )
    gpu_names = ", ".join(d.name for d in devices if d.name != CPU and d.layers)
    if ngl >= n_layers:
        vram = sum(d.bytes for d in devices if d.name != CPU)
        return "fits_gpu", f"all {n_layers} layers on {gpu_names} ({gb(vram)} of GPU memory)"
    if ngl > 0:
        return "partial_offload", (
            f"{ngl} of {n_layers} layers on {gpu_names}, the rest run from RAM (slower)"
        )
    cpu = devices[0]
    if hw.gpus and not hw.can_offload:
        why = "this llama.cpp build cannot offload to a GPU"
    elif not hw.gpus:
        why = "no GPU found"
    elif p.load.n_gpu_layers == 0:
        why = "GPU offload is turned off"
    else:
        why = "not even one layer fits in the GPU's free memory"
    return "ram_only", f"{gb(cpu.bytes)} in RAM ({why})"


def fit_context(spec: ModelSpec, p: EstimateParams, hw: Hardware, dry: DryRun | None = None) -> int:
    """The largest context (a multiple of 256, up to the asked one) that fits; 0 if none.

    Uses the analytic model (a dry run per step would cost 0.4 s each); when a dry run of the
    asked settings exists its compute size is kept, which only shrinks with the context.
    """
    hi = max(pad(p.load.n_ctx if p.load.n_ctx > 0 else spec.n_ctx_train) // CTX_PAD, 1)
    lo, best = 1, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        q = p.with_load(n_ctx=mid * CTX_PAD)
        if plan(spec, q, hw, None, []).fits:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best * CTX_PAD
