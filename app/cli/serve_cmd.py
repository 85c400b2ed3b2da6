"""`candlewick serve`: the OpenAI- and Ollama-compatible HTTP API on the local models.

The socket opens first (so `/health` answers 503 while the first model loads), `--model` loads
on a background thread, and the checks that keep the server safe (no network bind without a
key) run before anything is loaded or bound. Every model of the library can be asked for by
name: one not loaded is loaded on demand with the server's settings, stays for `--keep-alive`
once idle, and makes room by unloading the least recently used idle one (engine.host.host).

Ollama's clients manage the library through it too: `/api/pull` downloads a Hugging Face
model (verified, resumable), `/api/copy`, `/api/create` and `/api/delete` name, make and
remove models (app.services.server_models).

Each model loads with the settings saved for it (in the window, or `candlewick models
settings`): an option typed on the command line > saved for this model > the options'
defaults. A saved context is each slot's.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import math
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.cli.common import USER_ERRORS, CliError, first_loads, library, positive_int
from app.cli.load_options import add_load_options, given_fields, load_params
from app.services.download_manager import DownloadManager
from app.services.hub import HubClient
from app.services.model_settings import ModelSettingsStore, SettingsProvider
from app.services.secrets import TokenStore
from app.services.server_models import LibraryModelStore
from app.services.service_log import logging_to
from engine.host.budget import MemoryBudget
from engine.host.host import DEFAULT_KEEP_S, Loadable, ModelHost
from engine.host.runtime import Model
from engine.memory.hardware import GiB
from engine.server import ServerConfig, ServerState, serve_forever
from engine.server.protocol.base import duration_seconds
from engine.server.runner import bind_socket
from engine.settings import LoadParams, SpeculativeSettings

log = logging.getLogger("candlewick.serve")


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve a model over an OpenAI/Ollama-compatible HTTP API")
    p.add_argument(
        "--model", default="default", help="'default', a library id or a path to a .gguf file"
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; others need an API key)",
    )
    p.add_argument("--port", type=int, default=8080)
    key = p.add_mutually_exclusive_group()
    key.add_argument("--api-key", default=None, help="require this key (Bearer token)")
    key.add_argument(
        "--api-key-file",
        type=Path,
        default=None,
        help="read the key from this file (keeps it out of the process list)",
    )
    p.add_argument(
        "--parallel", type=positive_int, default=4, help="requests decoded together (slots)"
    )
    p.add_argument(
        "--lookup",
        action="store_true",
        help="prompt-lookup speculative decoding for every request in flight, while it "
        "measures faster (drafts from the request's own prompt; pays when answers quote it)",
    )
    p.add_argument(
        "--draft-max",
        type=positive_int,
        default=None,
        help="most tokens drafted a step with --lookup (default: chosen per match)",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        help="allow browser pages from this origin (repeatable; closed by default)",
    )
    p.add_argument(
        "--webui",
        metavar="DIR",
        default=None,
        help="serve the web UI built in DIR at / (llama-server's: see docs/server.md)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=64,
        help="requests waiting for a slot before new ones get 429",
    )
    p.add_argument(
        "--max-tokens",
        type=positive_int,
        default=4096,
        help="the most tokens one request may generate",
    )
    p.add_argument(
        "--timeout", type=float, default=600.0, help="seconds a request may take, waiting included"
    )
    p.add_argument(
        "--no-embeddings", action="store_true", help="turn /v1/embeddings and /api/embed off"
    )
    p.add_argument(
        "--keep-alive",
        type=duration_arg,
        default=DEFAULT_KEEP_S,
        help="how long a model loaded on demand stays once idle: seconds or a "
        "duration (5m, 1h); 0 unloads it when idle, -1 keeps it (default 5m)",
    )
    p.add_argument(
        "--ram-budget",
        type=float,
        default=None,
        metavar="GIB",
        help="RAM the loaded models may take together, in GiB (default: what is "
        "free when a model loads)",
    )
    p.add_argument(
        "--log-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="also append what it prints to this file, each line timed (the background "
        "service's log: `candlewick service logs`)",
    )
    p.add_argument(
        "--slot-save-path",
        type=Path,
        default=None,
        metavar="DIR",
        help="the folder where POST /slots/{id}?action=save|restore keep a slot's prompt "
        "state (created if missing; without it those actions are refused)",
    )
    p.add_argument(
        "--stt-model",
        type=Path,
        default=None,
        metavar="PATH",
        help="the whisper.cpp model (ggml .bin) that POST /v1/audio/transcriptions and "
        "/v1/audio/translations use (default: the one chosen with `models use-stt`); checked "
        "at start, loaded on the first request",
    )
    p.add_argument(
        "--spm-infill",
        action="store_true",
        help="/infill puts the suffix before the prefix (the suffix/prefix/middle order some "
        "code models were trained on)",
    )
    p.add_argument(
        "--reasoning-budget",
        type=int,
        default=-1,
        metavar="N",
        help="a thinking model's thinking ends after N tokens and its answer follows; 0: no "
        "thinking, -1: no limit (default); a request's own budget (reasoning_effort, "
        "Anthropic's budget_tokens) goes first",
    )
    add_load_options(p, ctx_help="context length of each slot, in tokens")
    g = p.add_argument_group("LoRA adapters (llama-server's options; GET/POST /lora-adapters)")
    g.add_argument(
        "--lora",
        action=LoraArg,
        nargs=1,
        metavar="FILE",
        dest="loras",
        help="a LoRA adapter (GGUF) loaded with the model at scale 1; repeatable, the ids "
        "follow the order given",
    )
    g.add_argument(
        "--lora-scaled",
        action=LoraArg,
        nargs=2,
        metavar=("FILE", "SCALE"),
        dest="loras",
        help="a LoRA adapter at this scale; repeatable",
    )
    g.add_argument(
        "--lora-init-without-apply",
        action="store_true",
        help="load the adapters at scale 0: requests use them only once POST /lora-adapters "
        "or their own `lora` sets a scale",
    )
    p.set_defaults(handler=run)


class LoraArg(argparse.Action):
    """--lora FILE and --lora-scaled FILE SCALE into one list, in the order given (the ids)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        path, scale = (values[0], "1") if len(values) == 1 else values
        try:
            value = float(scale)
        except ValueError:
            parser.error(f"{option_string}: the scale {scale!r} is not a number")
        if not math.isfinite(value):
            parser.error(f"{option_string}: the scale must be a finite number")
        given = getattr(namespace, self.dest, None) or []
        setattr(namespace, self.dest, [*given, (path, value)])


def _read_key(args: argparse.Namespace) -> str | None:
    if args.api_key_file is None:
        key_arg: str | None = args.api_key
        return key_arg
    try:
        key = str(args.api_key_file.read_text(encoding="utf-8")).strip()
    except (OSError, UnicodeDecodeError) as e:
        raise CliError(f"cannot read the API key file {args.api_key_file}: {e}") from None
    if not key:
        raise CliError(f"the API key file {args.api_key_file} is empty")
    return key


def _stt_model(path: Path | None) -> Path | None:
    """--stt-model, its file checked (not loaded): a wrong file is one line at start.
    Without it, the model chosen with `models use-stt`, if it still reads as one (else a
    warning, and the transcription routes say how to name one)."""
    from app.services.speech_models import current_stt_model
    from engine.model.whisper_file import WhisperFileError, read_whisper

    if path is not None:
        read_whisper(path)  # WhisperFileError: one line
        return path.resolve()
    chosen = current_stt_model()
    if chosen is None:
        return None
    try:
        read_whisper(chosen)
    except WhisperFileError as e:
        log.warning("no speech to text: the chosen model is unusable: %s", e)
        return None
    return chosen.resolve()


def _slot_folder(path: Path | None) -> Path | None:
    """--slot-save-path, made if missing; one line when it cannot be."""
    if path is None:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CliError(f"cannot use {path} for slot files: {e.strerror or e}") from None
    return path.resolve()


def duration_arg(text: str) -> float | None:
    """Seconds from "300", "5m", "1h30m"; None (keep) for a negative one."""
    try:
        v = duration_seconds(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return None if v < 0 else v


def catalog(
    params: LoadParams,
    extra: Path | None = None,
    settings: SettingsProvider | None = None,
    *,
    adapted: Path | None = None,
) -> Callable[[], list[Loadable]]:
    """The library's models (read on each lookup, so a download is seen at once), each loaded
    with the server's settings, or those `settings` gives for its file; `extra`: a file named
    on the command line. The LoRA adapters of `params` go only with `adapted` (the model
    served: an adapter is made for one model's tensors)."""
    lib = library()

    def given(path: Path) -> LoadParams:
        out = (settings(path) if settings is not None else None) or params
        if out.loras and (adapted is None or path.resolve() != adapted.resolve()):
            out = dataclasses.replace(out, loras=())
        return out

    def specs() -> list[Loadable]:
        out = [
            Loadable(e.id, e.path, given(e.path), aliases=(e.slug,), title=e.name)
            for e in lib.entries()
            if e.error is None
        ]
        if extra is not None and not any(s.path.resolve() == extra.resolve() for s in out):
            out.append(Loadable(extra.stem, extra, given(extra), title=extra.name))
        return out

    return specs


def model_store() -> LibraryModelStore:
    """Ollama's pulls, copies and created models over the library, downloading through a
    download manager of its own, made at the first pull (the Hub token as `candlewick
    models token` saved it)."""
    lib = library()
    return LibraryModelStore(
        lib, lambda: DownloadManager(lib.downloads_state, HubClient(token=TokenStore().get))
    )


def saved_settings(args: argparse.Namespace, params: LoadParams) -> SettingsProvider:
    """Each model's saved settings over the server's (`params`); options typed on the
    command line keep their value."""
    return ModelSettingsStore.for_paths().provider(
        params, slots=args.parallel, keep=given_fields(args)
    )


def serve_load_params(args: argparse.Namespace) -> LoadParams:
    """The load options for --parallel slots of --ctx tokens each, with --lookup."""
    lookup = SpeculativeSettings("lookup", draft_max=args.draft_max) if args.lookup else None
    zero = args.lora_init_without_apply
    loras = tuple((str(path), 0.0 if zero else scale) for path, scale in args.loras or ())
    return load_params(args, slots=args.parallel, speculative=lookup, loras=loras)


def run(args: argparse.Namespace) -> int:
    if args.log_file is None:
        return serve(args)
    with logging_to(args.log_file):
        try:
            return serve(args)
        # As `candlewick` says them (app.cli.main), while stderr still reaches the file: a
        # service's failure is read there.
        except USER_ERRORS as e:
            print(f"candlewick: error: {e}", file=sys.stderr)
            return 2
        except Exception as e:
            log.debug("internal error", exc_info=True)
            print(f"candlewick: internal error: {type(e).__name__}: {e}", file=sys.stderr)
            return 1


def serve(args: argparse.Namespace) -> int:
    if args.max_queue < 0:
        raise CliError("--max-queue must be 0 or more")
    if args.timeout <= 0:
        raise CliError("--timeout must be positive")
    config = ServerConfig(
        host=args.host,
        port=args.port,
        api_key=_read_key(args),
        cors_origins=tuple(args.cors_origin),
        webui_dir=args.webui,
        max_queue=args.max_queue,
        max_tokens_cap=args.max_tokens,
        default_max_tokens=min(512, args.max_tokens),
        request_timeout_s=args.timeout,
        reasoning_budget=args.reasoning_budget,
    )
    config.validate()  # refuses an unsafe bind before loading anything
    path = library().resolve(args.model)
    model_id = args.model if args.model != "default" else "default"
    if Path(args.model).suffix == ".gguf":
        model_id = Path(args.model).stem
    config = dataclasses.replace(
        config,
        model_id=model_id,
        embeddings=not args.no_embeddings,
        slot_save_path=_slot_folder(args.slot_save_path),
        spm_infill=args.spm_infill,
        stt_model=_stt_model(args.stt_model),
    )
    params = serve_load_params(args)
    params.validate()  # e.g. a quantized V cache with flash attention off: one line, exit 2
    if args.ram_budget is not None and args.ram_budget <= 0:
        raise CliError("--ram-budget must be positive")
    budget = (
        MemoryBudget({"CPU": int(args.ram_budget * GiB)}) if args.ram_budget is not None else None
    )
    loads = first_loads()
    saved = saved_settings(args, params)
    host = ModelHost(
        catalog(params, path if Path(args.model).suffix == ".gguf" else None, saved, adapted=path),
        budget,
        loader=lambda spec: Model(spec.path, spec.params, first_loads=loads),
        default_keep_s=args.keep_alive,
    )
    store = model_store()
    state = ServerState(config, host=host, store=store)
    state.starting = True
    sock = bind_socket(config.host, config.port)
    port = sock.getsockname()[1]

    def load() -> None:
        try:
            # The model named at start stays until it must make room for another.
            host.acquire(model_id, keep_s=None).release()
            loaded = state.loaded
            assert loaded is not None
            # Ready before the line says so: a client that waits for the line asks /health next.
            state.starting = False
            print(
                f"candlewick: serving {path.name} as '{model_id}' on "
                f"http://{_host(config.host)}:{port} ({args.parallel} slots"
                f"{', API key required' if config.api_key else ''}; "
                f"{_describe(loaded.settings())}"
                f"{'; settings saved for this model' if saved(path) else ''}); "
                "other library models load on demand",
                file=sys.stderr,
            )
        except Exception as e:  # reported on /health and in the terminal
            state.load_error = f"loading failed: {e}"
            print(f"candlewick: error: {state.load_error}", file=sys.stderr)
        finally:
            state.starting = False

    loader = threading.Thread(target=load, name="candlewick-load", daemon=True)
    loader.start()
    try:
        # uvicorn shuts down gracefully on Ctrl+C/SIGTERM, then re-raises the signal.
        with contextlib.suppress(KeyboardInterrupt):
            serve_forever(state, sock=sock, access_log=bool(args.verbose))
    finally:
        loader.join()
        state.close()
        host.close()
        store.close()  # a pull still running stays paused, its bytes kept
    return 2 if state.load_error else 0


def _describe(settings: dict[str, Any]) -> str:
    kv = settings["kv_type_k"]
    if settings["kv_type_v"] != kv:
        kv = f"K {kv}, V {settings['kv_type_v']}"
    fa = settings["flash_attn"]
    if fa != settings["flash_attn_requested"]:
        fa = f"{fa} ({settings['flash_attn_requested']})"
    spec = "; prompt lookup" if settings.get("speculative") == "lookup" else ""
    return (
        f"{settings['ctx_per_slot']} tokens per slot, KV cache {kv} "
        f"{settings['kv_cache_mib']} MiB, flash attention {fa}{spec}"
    )


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
