"""`candlewick estimate MODEL`: how much memory a model needs, where it goes, and if it fits."""

from __future__ import annotations

import argparse
from typing import Any

from app.cli.common import CliError, library, positive_int, print_json
from app.cli.load_options import add_load_options, load_params
from engine.memory import hardware
from engine.memory.estimate import estimate
from engine.memory.hardware import CPU, GiB, MiB
from engine.memory.params import EstimateParams
from engine.memory.result import MemoryEstimate
from engine.model.remote_gguf import is_remote, read_remote_gguf
from engine.settings import LoadParams


def _size_arg(value: str) -> int:
    try:
        return hardware.parse_size(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _margin_arg(value: str) -> int:
    try:
        return hardware.parse_size(value, allow_zero=True)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def register(sub: Any) -> None:
    p = sub.add_parser(
        "estimate",
        help="estimate a model's memory before loading (or downloading) it",
        description="Estimate weights, KV cache, compute and output memory, per device, and "
        "whether the model fits. MODEL is a library id, a path, an http(s) URL or "
        "hf:owner/repo/file.gguf (only the file's header is fetched).",
    )
    p.add_argument("model", metavar="MODEL")
    p.add_argument(
        "--parallel",
        type=positive_int,
        default=1,
        help="parallel sequences; they share --ctx (docs/memory.md)",
    )
    p.add_argument(
        "--simulate-gpu",
        type=_size_arg,
        action="append",
        metavar="SIZE",
        help="plan for an empty GPU of this size instead of the real devices "
        "(e.g. 8GiB; repeat for several GPUs)",
    )
    p.add_argument(
        "--simulate-ram", type=_size_arg, metavar="SIZE", help="plan for this much free RAM"
    )
    p.add_argument(
        "--margin",
        type=_margin_arg,
        metavar="SIZE",
        help="memory to keep free on each device (default: 5%%, 64 MiB-1 GiB)",
    )
    p.add_argument(
        "--method",
        choices=("auto", "dry-run", "analytic"),
        default="auto",
        help="dry-run asks llama.cpp (local files); analytic uses the header only",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_load_options(
        p,
        ctx_help="context length in tokens (with --parallel: all the sequences' together)",
        about="the load to estimate (--threads changes no memory)",
    )
    p.set_defaults(handler=run_estimate)


def estimate_load_params(args: argparse.Namespace) -> LoadParams:
    """The load options; --parallel splits --ctx between the sequences (unlike serve's slots,
    which get --ctx each), as llama.cpp's own n_seq_max does."""
    return load_params(args, n_seq_max=args.parallel)


def run_estimate(args: argparse.Namespace) -> int:
    params = EstimateParams(estimate_load_params(args), margin_bytes=args.margin)
    params.validate()
    if args.simulate_gpu or args.simulate_ram:
        hw = hardware.simulate(args.simulate_gpu or [], ram_bytes=args.simulate_ram)
    else:
        hw = hardware.detect()
    extra: dict[str, Any] = {}
    if is_remote(args.model):
        if args.method == "dry-run":
            raise CliError("a dry run needs the file on disk; remote files use --method analytic")
        head = read_remote_gguf(args.model)
        est = estimate(head.gguf, params, hardware=hw, method="analytic")
        extra = {"source": head.url, "file_bytes": head.file_bytes, "bytes_read": head.bytes_read}
    else:
        path = library().resolve(args.model)
        est = estimate(path, params, hardware=hw, method=args.method)
        extra = {"source": str(path)}
    if args.json:
        d = est.to_dict()
        d.update(extra)
        d["hardware"] = hw.to_dict()
        print_json(d)
    else:
        _print_table(est, extra, hw)
    return 0


def _fmt(n: int) -> str:
    if n >= GiB:
        return f"{n / GiB:.2f} GiB"
    return f"{n / MiB:.1f} MiB"


def _print_table(est: MemoryEstimate, extra: dict[str, Any], hw: hardware.Hardware) -> None:
    p = est.params.load
    kv = p.type_k if p.type_k == p.type_v else f"{p.type_k}/{p.type_v}"
    print(f"Model:    {est.model}")
    if "bytes_read" in extra:
        print(
            f"Source:   {extra['source']} (read {_fmt(extra['bytes_read'])} of "
            f"{_fmt(extra['file_bytes'])})"
        )
    print(
        f"Settings: context {est.n_ctx}, KV {kv}, flash attention {p.flash_attn}, "
        f"{p.n_seq_max} sequence(s), batch {p.n_batch}/{p.n_ubatch}"
    )
    print(f"Method:   {est.method}")
    print()
    rows = [
        ("weights", est.weights_bytes),
        ("KV cache", est.kv_bytes),
        ("compute", est.compute_bytes),
        ("output", est.output_bytes),
        ("total", est.total_bytes),
    ]
    for label, n in rows:
        print(f"  {label:<10}{_fmt(n):>12}")
    # Outside llama.cpp's buffers, so not in "total"; the fit check and NEEDS count them.
    gpus = [d for d in est.devices if d.name != CPU and d.overhead_bytes]
    if gpus:
        what = (
            "GPU driver context"
            if len(gpus) == 1
            else f"GPU driver contexts, {_fmt(gpus[0].overhead_bytes)} on each GPU used"
        )
        print(f"  {'+ runtime':<10}{_fmt(est.gpu_runtime_bytes):>12}  ({what})")
    if est.prompt_cache_bytes:
        print(
            f"  {'+ cache':<10}{_fmt(est.prompt_cache_bytes):>12}  "
            "(prompt cache in RAM: saved prompts, up to this much; --cache-ram)"
        )
    print()
    print(f"  {'DEVICE':<10}{'LAYERS':>7}{'NEEDS':>12}{'FREE':>12}")
    for d in est.devices:
        free = "-" if d.free_bytes is None else _fmt(d.free_bytes)
        name = d.name + (" (sim)" if d.simulated else "")
        print(f"  {name:<10}{d.layers:>7}{_fmt(d.bytes + d.overhead_bytes):>12}{free:>12}")
    print()
    print(f"GPU layers: {est.gpu_layers} of {est.n_layers}")
    print(f"Verdict:  {est.to_dict()['verdict_text']}: {est.reason}")
    for note in (*est.notes, *hw.notes):
        print(f"Note:     {note}")
