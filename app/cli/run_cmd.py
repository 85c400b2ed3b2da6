"""`candlewick run MODEL PROMPT`: stream an answer to stdout, or print stats as JSON.

The model loads with the settings saved for it, and its saved sampling defaults apply: an
option typed on the command line > saved for this model > the options' defaults. Its context,
when neither --ctx nor a saved one says, is sized to the one answer (`one_shot_ctx`).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from app.cli.common import CliError, first_loads, library, positive_int, print_json
from app.cli.load_options import (
    Given,
    add_load_options,
    given_fields,
    given_options,
    load_params,
)
from app.services.connections import ConnectionsError, ConnectionStore
from app.services.model_settings import SAMPLING_KEYS, SERVED_KEYS, ModelSettingsStore
from engine.errors import EngineError
from engine.host.chat_engine import ChatRequest
from engine.host.generation import Generation
from engine.host.runtime import Model
from engine.host.speculative import DEFAULT_MODEL_DRAFT_MAX, spec_stats
from engine.media.audio import decode_wav
from engine.media.images import decode_image
from engine.memory.estimate import estimate
from engine.memory.params import EstimateParams
from engine.memory.result import DoesNotFitError
from engine.model.gguf import read_gguf
from engine.native import huge_pages
from engine.native.projector import Media, marker
from engine.settings import (
    DEFAULT_DRAFT_MAX,
    FlashAttn,
    LoadParams,
    SamplingParams,
    SpeculativeSettings,
)


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="answer one prompt with a model")
    p.add_argument("model", help="'default', a library id or a path to a .gguf file")
    p.add_argument("prompt", help="the user message")
    p.add_argument("--max-tokens", action=Given, type=positive_int, default=512)
    d = SamplingParams()  # the app's defaults (and where they come from)
    p.add_argument(
        "--temperature",
        action=Given,
        type=float,
        default=d.temperature,
        help="0 = greedy (deterministic)",
    )
    p.add_argument("--top-p", action=Given, type=float, default=d.top_p)
    p.add_argument("--top-k", action=Given, type=int, default=d.top_k)
    p.add_argument("--min-p", action=Given, type=float, default=d.min_p)
    p.add_argument("--repeat-penalty", action=Given, type=float, default=d.repeat_penalty)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--system", default=None, help="system prompt")
    p.add_argument("--json", action="store_true", help="print one JSON object with the stats")
    p.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="FILE",
        help="an image to ask about (repeatable; needs --mmproj with a vision projector)",
    )
    p.add_argument(
        "--audio",
        action="append",
        default=[],
        metavar="FILE",
        help="a WAV clip to ask about (repeatable; needs --mmproj with an audio projector)",
    )
    spec = p.add_mutually_exclusive_group()
    spec.add_argument(
        "--draft",
        metavar="MODEL",
        default=None,
        help="speculative decoding with this smaller draft model (same tokenizer)",
    )
    spec.add_argument(
        "--lookup",
        action="store_true",
        help="speculative decoding with prompt lookup (drafts copied from the "
        "prompt; fast when the answer quotes it)",
    )
    p.add_argument(
        "--draft-max",
        type=positive_int,
        default=None,
        help=(
            f"most tokens drafted per step (default {DEFAULT_DRAFT_MAX} for --lookup, "
            f"{DEFAULT_MODEL_DRAFT_MAX} for --draft)"
        ),
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="load even when the memory estimate says the model does not fit",
    )
    p.add_argument(
        "--connection",
        metavar="NAME",
        default=None,
        help="answer with a remote engine (a saved connection, see `candlewick "
        "connections`); MODEL is then the server's model id, or 'default' for "
        "the connection's own",
    )
    add_load_options(p, about="how the model is loaded (not with --connection)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.connection:
        return run_remote(args)
    path = library().resolve(args.model)
    params, sampling = with_saved_settings(path, args, run_load_params(args), _sampling(args))
    settings = params.speculative or SpeculativeSettings()
    messages = _messages(args)
    if (args.image or args.audio) and not params.mmproj:
        raise CliError("--image and --audio need the model's projector: add --mmproj PATH")
    if not args.force:
        refuse_if_too_big(path, params)
    cancel = threading.Event()
    # A host of one model and one request: the same decode loop the app and the server use.
    with Model(path, params, first_loads=first_loads()) as model:
        media = _media(args, model)
        if media:
            messages[-1]["content"] = marker() * len(media) + "\n" + args.prompt
        gen = model.generate(messages, sampling, cancel=cancel, media=media)
        _stream(gen, cancel, args.json)
        st = gen.stats
        if args.json:
            print_json(
                {
                    "text": gen.text,
                    "ttft_s": round(st.ttft_s, 4),
                    "prompt_tokens": st.prompt_tokens,
                    "prompt_tps": round(st.prompt_tps, 2),
                    "gen_tokens": st.gen_tokens,
                    "gen_tps": round(st.gen_tps, 2),
                    "stop_reason": st.stop_reason,
                    "total_s": round(st.total_s, 4),
                    "gen_tps_wall": round(st.gen_tps_wall, 2),
                    "model": str(path),
                    "speculative": settings.mode,
                    **spec_stats(st),
                    "kv_type": args.kv_type,
                    # what the load did ('auto' resolved), as the server's /health says it
                    "flash_attn": "on" if model.flash_attn_on else "off",
                    "kv_mib": round(model.memory_actual.kv_bytes / 2**20, 2),
                    "huge_pages": huge_pages.in_use(),
                }
            )
        else:
            sys.stdout.write("\n")
    return 130 if st.stop_reason == "cancelled" else 0


def run_load_params(args: argparse.Namespace) -> LoadParams:
    """The load options, with speculative decoding when --draft or --lookup asks for it."""
    # Speculation is exact only where batched and one-token kernels agree: with flash
    # attention on (docs/speculative.md), so 'auto' means on when drafting.
    flash: FlashAttn = args.flash_attn
    if flash == "auto" and (args.draft or args.lookup):
        flash = "on"
    settings = SpeculativeSettings(
        mode="draft" if args.draft else "lookup" if args.lookup else "off",
        draft_model=str(library().resolve(args.draft)) if args.draft else None,
        draft_max=args.draft_max,
    )
    settings.validate()
    return load_params(args, flash_attn=flash, speculative=settings)


def with_saved_settings(
    path: Path, args: argparse.Namespace, params: LoadParams, sampling: SamplingParams
) -> tuple[LoadParams, SamplingParams]:
    """The settings saved for the model under the options typed on the command line."""
    saved = ModelSettingsStore.for_paths().get(path)
    keep = given_fields(args)
    if args.draft or args.lookup:
        keep.add("flash_attn")  # drafting chose it: exact output needs it
    params = saved.load_params(params, keys=SERVED_KEYS, keep=keep)
    if "n_ctx" not in keep and "n_ctx" not in saved.saved and not (args.image or args.audio):
        train = int(read_gguf(path).arch_value("context_length", 0) or 0)
        prompt = len(args.prompt.encode()) + len((args.system or "").encode())
        drafts = DRAFT_MARGIN if args.draft or args.lookup else 0
        n_ctx = one_shot_ctx(prompt, args.max_tokens + drafts, train)
        params = dataclasses.replace(params, n_ctx=n_ctx)
    typed = given_options(args)
    sampling = dataclasses.replace(
        sampling,
        **{k: v for k, v in saved.saved.items() if k in SAMPLING_KEYS and k not in typed},
    )
    return params, sampling


# A one-shot context: the prompt (its UTF-8 bytes: no token is shorter than a byte, so the
# bound holds before the model is loaded), the answer, what the chat template wraps around them
# (role markers, a default system prompt), in steps of the cache's 256-cell views. Media and a
# context given or saved keep the --ctx rules.
RUN_CTX_MIN = 512
RUN_CTX_STEP = 256
TEMPLATE_OVERHEAD = 128
DRAFT_MARGIN = 64  # a speculative step verifies up to 64 drafted tokens past the answer's end


def one_shot_ctx(prompt_bytes: int, answer_tokens: int, train_ctx: int) -> int:
    """Cells for one prompt and one answer of up to `answer_tokens`: rounded up to
    RUN_CTX_STEP, at least RUN_CTX_MIN, never above the model's training context (0: unknown)."""
    need = prompt_bytes + answer_tokens + TEMPLATE_OVERHEAD
    n_ctx = max(RUN_CTX_MIN, -(-need // RUN_CTX_STEP) * RUN_CTX_STEP)
    return min(n_ctx, train_ctx) if train_ctx > 0 else n_ctx


def run_remote(args: argparse.Namespace) -> int:
    """The same answer from a remote engine; its figures are measured here, on the client."""
    if args.draft or args.lookup:
        raise CliError("speculative decoding is the server's business with --connection")
    try:
        engine = ConnectionStore().engine(
            args.connection, model=None if args.model == "default" else args.model
        )
    except ConnectionsError as e:
        raise CliError(str(e)) from None
    cancel = threading.Event()
    reply = engine.reply(ChatRequest(_messages(args), _sampling(args)), cancel)
    try:
        _stream(reply, cancel, args.json)
    except EngineError:
        if not args.json and reply.text:
            sys.stdout.write("\n")  # the partial answer stays; the error follows on stderr
        raise
    st = reply.stats
    if args.json:
        print_json(
            {
                "text": reply.text,
                "ttft_s": round(st.ttft_s, 4),
                "prompt_tokens": reply.prompt_tokens,
                "gen_tokens": st.gen_tokens,
                "gen_tps": round(st.gen_tps, 2),
                "stop_reason": st.stop_reason,
                "total_s": round(st.total_s, 4),
                "measured_on": st.measured_on,
                "server_usage": list(st.server_usage),
                "connection": args.connection,
                "model": engine.model,
            }
        )
    else:
        sys.stdout.write("\n")
    return 130 if st.stop_reason == "cancelled" else 0


def _sampling(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repeat_penalty=args.repeat_penalty,
        seed=args.seed,
        max_tokens=args.max_tokens,
        stop=tuple(args.stop),
    )


def _messages(args: argparse.Namespace) -> list[dict[str, str]]:
    messages = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    messages.append({"role": "user", "content": args.prompt})
    return messages


def _media(args: argparse.Namespace, model: Model) -> list[Media]:
    """The --image and --audio files, decoded (images first, in the order given)."""
    out: list[Media] = [decode_image(_read(f), Path(f).name) for f in args.image]
    if args.audio:
        assert model.projector is not None
        rate = model.projector.audio_rate
        out += [decode_wav(_read(f), rate, Path(f).name) for f in args.audio]
    return out


def _read(name: str) -> bytes:
    try:
        return Path(name).read_bytes()
    except OSError as e:
        raise CliError(f"cannot read {name}: {e.strerror or e}") from None


# Text reaches the terminal this often: smooth to the eye, and a few wake-ups a second instead
# of one per token (Generation.paced); --json prints at the end.
TERMINAL_INTERVAL_S = 1 / 30
JSON_INTERVAL_S = 0.1


def _stream(gen: Iterable[str], cancel: threading.Event, as_json: bool) -> None:
    """Prints the text as it comes (or nothing for --json); a remote reply piece by piece."""
    pieces = (
        gen.paced(JSON_INTERVAL_S if as_json else TERMINAL_INTERVAL_S)
        if isinstance(gen, Generation)
        else gen
    )
    try:
        for piece in pieces:
            if not as_json:
                sys.stdout.write(piece)
                sys.stdout.flush()
    except KeyboardInterrupt:
        cancel.set()
        for _ in gen:  # let the loop see the flag and release the context
            pass


def refuse_if_too_big(path: Path, params: LoadParams) -> None:
    """Check the analytic estimate (header only, milliseconds) against free memory first:
    a model that cannot fit is refused with the reason instead of being swapped to death."""
    est = estimate(path, EstimateParams(params), method="analytic")
    if not est.fits:
        raise DoesNotFitError(f"{est.reason} (add --force to load anyway)")
