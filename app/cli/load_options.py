"""The load options of `run`, `serve`, `estimate` and `bench`, declared once.

Each command adds them with `add_load_options` and turns what was parsed into a `LoadParams`
with `load_params`, so the same arguments load (or estimate) the same way everywhere. Only
what a command's own concepts decide stays with it: how many sequences share the context
(serve's slots, bench's concurrency, estimate's --parallel) and speculative decoding.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any, get_args

from app.cli.common import positive_int
from engine.settings import FlashAttn, GpuLayers, LoadParams

# The cache types worth offering: f16, and the two quantized ones llama.cpp's CPU and GPU
# kernels both handle (engine.settings.KV_TYPES names more).
KV_CHOICES = ("f16", "q8_0", "q4_0")
GIVEN = "given_load_options"  # the namespace attribute: the load options typed by the user
# Which LoadParams fields an option sets: a flag the user typed wins over the settings saved
# for the model (app.services.model_settings), its default does not.
FIELDS_OF: dict[str, tuple[str, ...]] = {
    "ctx": ("n_ctx",),
    "gpu_layers": ("n_gpu_layers",),
    "threads": ("n_threads",),
    "kv_type": ("type_k", "type_v"),
    "flash_attn": ("flash_attn",),
    "mmproj": ("mmproj",),
}


class Given(argparse.Action):
    """Stores the value, and notes that the option was given (not left at its default)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, GIVEN, {*getattr(namespace, GIVEN, ()), self.dest})


def given_options(args: argparse.Namespace) -> set[str]:
    """The destinations of the options (declared with `action=Given`) typed by the user."""
    return set(getattr(args, GIVEN, ()))


def given_fields(args: argparse.Namespace) -> set[str]:
    """The LoadParams fields the command line set explicitly."""
    return {f for dest in getattr(args, GIVEN, ()) for f in FIELDS_OF.get(dest, ())}


def gpu_layers_arg(value: str) -> GpuLayers:
    if value in ("auto", "all"):
        return value  # type: ignore[return-value]
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError("must be a number, 'auto' or 'all'") from None
    if n < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return n


def cache_ram_arg(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of MiB") from None
    if n < 0:
        raise argparse.ArgumentTypeError("must be 0 (no prompt cache) or more")
    return n


def add_load_options(
    parser: argparse.ArgumentParser,
    *,
    ctx_help: str = "context length in tokens",
    ctx_default: int | None = 4096,
    about: str = "how the model is loaded",
) -> None:
    """Add the load options; `ctx_help` says what --ctx is for this command (per slot, per
    request, shared by sequences), and `ctx_default` None lets the command size it."""
    d = LoadParams()
    g = parser.add_argument_group("load options", about)
    g.add_argument("--ctx", action=Given, type=positive_int, default=ctx_default, help=ctx_help)
    g.add_argument(
        "--gpu-layers",
        action=Given,
        type=gpu_layers_arg,
        default=d.n_gpu_layers,
        help="layers to offload to the GPU: a number, 'auto' (as many as fit) or 'all'",
    )
    g.add_argument(
        "--threads",
        action=Given,
        type=positive_int,
        default=d.n_threads,
        help="CPU threads (default: the physical cores)",
    )
    g.add_argument(
        "--kv-type",
        action=Given,
        choices=KV_CHOICES,
        default=d.type_k,
        help="K and V cache type; q8_0 halves its memory, q4_0 quarters it "
        "(a quantized V cache needs flash attention)",
    )
    g.add_argument(
        "--flash-attn",
        action=Given,
        choices=get_args(FlashAttn),
        default=d.flash_attn,
        help="flash attention (auto: llama.cpp's choice with a GPU, otherwise on, but for "
        "narrow heads on a CPU whose kernels lose at depth only while a sequence's context "
        "stays short; a quantized V cache needs it; off answers a follow-up at depth sooner, "
        "see docs/benchmarks.md)",
    )
    g.add_argument(
        "--batch",
        type=positive_int,
        default=d.n_batch,
        help=f"logical batch size: prompt tokens handed to llama.cpp at once ({d.n_batch})",
    )
    g.add_argument(
        "--ubatch",
        type=positive_int,
        default=d.n_ubatch,
        help=f"physical batch size: tokens computed together ({d.n_ubatch})",
    )
    g.add_argument(
        "--mmproj",
        action=Given,
        metavar="PATH",
        default=None,
        help="the model's multimodal projector (an mmproj GGUF): lets it read images or audio",
    )
    g.add_argument(
        "--cache-ram",
        type=cache_ram_arg,
        default=d.state_cache_mb,
        metavar="MiB",
        help="MiB of RAM for saved prompt states, every client's: a request that shares a "
        "longer prefix with one than any slot holds restores it instead of reading it again; "
        f"least recently used go first (default {d.state_cache_mb}; 0 turns the cache off)",
    )


def load_params(
    args: argparse.Namespace, *, slots: int = 1, ctx: int | None = None, **changes: Any
) -> LoadParams:
    """The `LoadParams` of the parsed load options: `slots` sequences of `ctx` tokens each
    (default: --ctx), with `changes` (speculative decoding, ...) on top."""
    per_slot = args.ctx if ctx is None else ctx
    params = LoadParams(
        n_ctx=per_slot * slots,
        n_seq_max=slots,
        n_gpu_layers=args.gpu_layers,
        n_threads=args.threads,
        n_batch=args.batch,
        n_ubatch=args.ubatch,
        type_k=args.kv_type,
        type_v=args.kv_type,
        flash_attn=args.flash_attn,
        state_cache_mb=args.cache_ram,
        mmproj=getattr(args, "mmproj", None),
    )
    return replace(params, **changes)


__all__ = [
    "KV_CHOICES",
    "Given",
    "add_load_options",
    "cache_ram_arg",
    "given_fields",
    "given_options",
    "gpu_layers_arg",
    "load_params",
]
