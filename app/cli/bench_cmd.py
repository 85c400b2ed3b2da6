"""`candlewick bench`: measure a model or a server with a realistic workload.

    candlewick bench --model default --workload chat --concurrency 1,2,4
    candlewick bench --model default --mmproj mmproj.gguf --workload vision --concurrency 1,2
    candlewick bench --url http://127.0.0.1:8080 --workload rag --out a.json --plot a.png
    candlewick bench --workload rag --collection notes --questions questions.txt -k 5
    candlewick bench compare a.json b.json
    candlewick bench quality --reference model-Q8_0.gguf model-Q4_K_M.gguf (bench_quality_cmd)

Exit codes: 0 done, 2 bad input, 3 every request failed (the table still says why), 130
interrupted.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from app.cli.bench_quality_cmd import register as register_quality
from app.cli.common import CliError, first_loads, library, positive_int, print_json
from app.cli.load_options import add_load_options, load_params
from engine.bench.embedded import round_context
from engine.bench.harness import (
    BenchConfig,
    EmbeddedTarget,
    HttpTarget,
    Progress,
    SamplingSetup,
    SchedulerTarget,
    Target,
    Tokenizer,
    local_server_pid,
    run_benchmark,
)
from engine.bench.levels import parse_levels
from engine.bench.media import check_reads_images, media_context_need
from engine.bench.quality_report import compare_quality, format_quality_compare
from engine.bench.quality_result import QualityResult, is_quality_result
from engine.bench.rag_workload import DEFAULT_BUDGET, grounded_workload, load_questions
from engine.bench.report import compare, format_compare, format_table
from engine.bench.result import BenchError, BenchResult, RetrievalReport
from engine.bench.workloads import BUILTIN, Workload, WorkloadError, load_workload
from engine.host.runtime import Model
from engine.model.gguf import GGUFFile
from engine.rag.grounding import DEFAULT_K, CountTokens, approx_tokens
from engine.rag.search import Hit, hybrid
from engine.rag.store import StoreError
from engine.remote.streaming import APIS, ClientError, StreamingClient
from engine.settings import LoadParams

EXIT_ALL_FAILED = 3


def concurrency_arg(value: str) -> list[int]:
    # argparse prints an ArgumentTypeError's message; a ValueError only as "invalid value".
    try:
        return parse_levels(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def positive_float(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not math.isfinite(x) or x <= 0:
        raise argparse.ArgumentTypeError("must be greater than 0")
    return x


def register(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark a model or an OpenAI/Ollama-compatible server",
        description="Measure TTFT, prompt and generation speed, latency, throughput, failures "
        "and peak memory at several concurrency levels with a realistic workload.",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--model",
        default=None,
        help="run the embedded engine on this model ('default', a library id or "
        "a .gguf path); the default when --url is not given",
    )
    src.add_argument(
        "--url", default=None, help="benchmark a running server, e.g. http://127.0.0.1:8080"
    )
    p.add_argument("--api", choices=APIS, default="openai", help="the server's API dialect")
    p.add_argument("--api-key", default=None, help="Bearer key for the server")
    p.add_argument(
        "--server-model",
        default=None,
        help="model name to request from the server (default: the first it lists)",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="model whose tokenizer counts tokens when the server reports no usage "
        "(default: the server's model file when it is on this machine)",
    )
    p.add_argument(
        "--server-pid",
        type=positive_int,
        default=None,
        help="process to sample for peak memory (default: found for local URLs)",
    )
    p.add_argument(
        "--workload",
        default="chat",
        help=f"{', '.join(BUILTIN)} or a JSONL file of prompts (default chat)",
    )
    rag = p.add_argument_group(
        "rag on a collection",
        "--workload rag with --collection: each question is searched in the collection "
        "first (timed apart, not in TTFT) and asked with the passages found",
    )
    rag.add_argument("--collection", default=None, help="a collection of `candlewick docs`")
    rag.add_argument(
        "--questions",
        type=Path,
        default=None,
        help='a .txt file (a question a line) or a JSON list of questions or of {"q": ...}',
    )
    rag.add_argument(
        "-k",
        type=positive_int,
        default=None,
        help=f"passages searched for per question (default {DEFAULT_K})",
    )
    rag.add_argument(
        "--rag-budget",
        type=positive_int,
        default=None,
        help=f"most tokens the passages may add to a prompt (default {DEFAULT_BUDGET})",
    )
    p.add_argument(
        "--concurrency",
        type=concurrency_arg,
        default=[1, 2, 4],
        help="comma-separated concurrency levels (default 1,2,4)",
    )
    p.add_argument(
        "--requests",
        type=positive_int,
        default=8,
        help="requests per concurrency level (default 8)",
    )
    p.add_argument(
        "--max-tokens",
        type=positive_int,
        default=None,
        help="cap each prompt's output length (default: the workload's own)",
    )
    p.add_argument(
        "--slo-ttft",
        type=positive_float,
        default=None,
        help="TTFT objective in seconds: report the largest concurrency meeting it",
    )
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=300.0,
        help="seconds one request may take before it counts as failed",
    )
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--warmup", type=int, default=1, help="untimed requests first (default 1)")
    p.add_argument(
        "--allow-prefix-cache",
        action="store_true",
        help="send prompts unchanged, letting the server reuse cached prefixes "
        "(default: each request gets a unique tag first)",
    )
    p.add_argument(
        "--no-bandwidth",
        action="store_true",
        help="skip the memory bandwidth measurement (no roofline)",
    )
    p.add_argument(
        "--bandwidth-mib",
        type=positive_int,
        default=512,
        help="buffer size for the bandwidth measurement (default 512 MiB; keep it "
        "well above the CPU caches)",
    )
    p.add_argument("--out", type=Path, default=None, help="write the full result as JSON")
    p.add_argument("--plot", type=Path, default=None, help="write charts as PNG")
    p.add_argument("--json", action="store_true", help="print the JSON result, not the table")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    add_load_options(
        p,
        ctx_help="context of each request, in tokens (default: fits the workload)",
        ctx_default=None,
        about="how the embedded engine loads the model (not with --url)",
    )
    p.set_defaults(handler=run)
    csub = p.add_subparsers(dest="bench_command", metavar="{compare,quality}")
    c = csub.add_parser("compare", help="print B/A ratios of two results")
    c.add_argument("a", type=Path, help="baseline result JSON (A)")
    c.add_argument("b", type=Path, help="result JSON to compare (B)")
    c.add_argument(
        "--json", dest="compare_json", action="store_true", help="print the ratios as JSON"
    )
    c.set_defaults(handler=run_compare)
    register_quality(csub)


# -- progress --------------------------------------------------------------------------------


class ProgressBar:
    """One live line on stderr when it is a terminal; otherwise a line per finished level."""

    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self.stream = stream
        self.enabled = enabled
        self.tty = stream.isatty()
        self._lock = threading.Lock()

    def __call__(self, p: Progress) -> None:
        if not self.enabled:
            return
        with self._lock:
            if p.phase == "warmup":
                line = "warming up..."
            elif p.phase == "bandwidth":
                line = "measuring memory bandwidth..."
            else:
                width = 24
                filled = width * p.done // max(1, p.total)
                line = (
                    f"level {p.level_index + 1}/{p.levels}  concurrency {p.concurrency:>3}"
                    f"  [{'#' * filled}{'.' * (width - filled)}] {p.done}/{p.total}"
                    f"  failed {p.failed}"
                )
            if self.tty:
                self.stream.write("\r\033[K" + line)
                if p.phase == "run" and p.done == p.total:
                    self.stream.write("\n")
            elif p.phase != "run" or p.done == p.total:
                self.stream.write(line + "\n")
            self.stream.flush()

    def finish(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()


# -- running ---------------------------------------------------------------------------------


def _workload(arg: str) -> Workload:
    try:
        return load_workload(arg)
    except WorkloadError as e:
        raise CliError(str(e)) from None


def _context_for(tokenizer: Tokenizer, workload: Workload, cap: int | None) -> int:
    """Smallest context (multiple of 256) that holds every prompt with its full answer."""
    need = max(
        tokenizer.count_chat(p.messages) + (min(p.max_tokens, cap) if cap else p.max_tokens)
        for p in workload.prompts
    )
    return int(math.ceil((need + 32) / 256) * 256)  # + the unique tag of each request


def run(args: argparse.Namespace) -> int:
    if args.bench_command == "compare":  # pragma: no cover - argparse routes it
        return run_compare(args)
    if args.warmup < 0:
        raise CliError("--warmup must be 0 or more")
    retrieval: RetrievalReport | None = None
    if args.collection is not None or args.questions is not None:
        workload, retrieval = _rag_workload(args)
    elif args.k is not None or args.rag_budget is not None:
        raise CliError("-k and --rag-budget go with --workload rag --collection NAME")
    else:
        workload = _workload(args.workload)
    if workload.images and not args.url and not args.mmproj:
        raise CliError(f"--workload {args.workload} needs the model's projector: add --mmproj PATH")
    config = BenchConfig(
        concurrency=args.concurrency,
        requests=args.requests,
        max_tokens=args.max_tokens,
        slo_ttft_s=args.slo_ttft,
        warmup=args.warmup,
        measure_bandwidth=not args.no_bandwidth,
        bandwidth_bytes=args.bandwidth_mib << 20,
        unique_prompts=not args.allow_prefix_cache,
    )
    config.validate()
    sampling = SamplingSetup(temperature=args.temperature, seed=args.seed)
    bar = ProgressBar(sys.stderr, not args.quiet and not args.json)
    cancel = threading.Event()
    command = ["candlewick", *sys.argv[1:]] if sys.argv[1:2] == ["bench"] else None
    closers: list[Any] = []
    try:
        target: Target
        model_file: GGUFFile | None = None
        if args.url:
            target, model_file = _http_target(args, sampling, closers)
        else:
            target, model_file = _embedded_target(args, workload, sampling, closers)
        try:
            result = run_benchmark(
                target,
                workload,
                config,
                model_file=model_file,
                progress=bar,
                cancel=cancel,
                command=command,
            )
        except KeyboardInterrupt:
            cancel.set()
            raise
        finally:
            bar.finish()
    except KeyboardInterrupt:
        cancel.set()  # wherever Ctrl+C lands, requests in flight must not be waited out
        raise
    finally:
        for close in reversed(closers):
            close()
    result.retrieval = retrieval
    return _report(args, result)


def _rag_workload(args: argparse.Namespace) -> tuple[Workload, RetrievalReport]:
    """The grounded prompts of `--questions` over `--collection`, retrieved now: the index
    and the embedding model are closed before the benchmark loads the chat model."""
    if args.workload != "rag":
        raise CliError("--collection and --questions go with --workload rag")
    if args.collection is None or args.questions is None:
        raise CliError("--workload rag on a collection needs both --collection and --questions")
    try:
        questions = load_questions(args.questions)
    except WorkloadError as e:
        raise CliError(str(e)) from None
    k = args.k or DEFAULT_K
    from app.services.documents import open_documents
    from app.services.embedding_models import EmbeddingModels

    with open_documents() as store:
        try:
            col = store.collection(args.collection)
        except StoreError:
            known = ", ".join(c.name for c in store.collections()) or "none yet"
            raise CliError(
                f"no collection named {args.collection!r} (collections: {known})"
            ) from None
        model_path = Path(col.model_path)
        if not model_path.is_file():
            raise CliError(f"the embedding model of '{col.name}' is gone: {model_path}")
        count, close_count = _chat_token_counter(args)
        models = EmbeddingModels(first_loads=first_loads())
        try:
            embedding = models.get(model_path)  # loaded before the timing starts

            def retrieve(question: str) -> list[Hit]:
                return hybrid(store, col.name, question, embedding.embed_query(question), k)

            return grounded_workload(
                questions,
                retrieve,
                count,
                collection=col.name,
                k=k,
                budget=args.rag_budget or DEFAULT_BUDGET,
                source=f"collection {col.name}, questions {args.questions.name}",
            )
        finally:
            models.close()
            close_count()


def _chat_token_counter(args: argparse.Namespace) -> tuple[CountTokens, Callable[[], None]]:
    """The chat model's token count, to fit the passages to the budget as the chat would: its
    tokenizer when the model is known here, else the cautious character estimate."""
    ref = args.tokenizer if args.url else (args.model or "default")
    if ref is None:
        return approx_tokens, lambda: None
    tok = Tokenizer(library().resolve(ref), first_loads=first_loads())
    return tok.count, tok.close


def bench_load_params(args: argparse.Namespace, n_ctx: int) -> LoadParams:
    """The load options for the embedded engine: concurrent requests share one context
    through the scheduler, each in its own sequence of `n_ctx` tokens."""
    return load_params(args, slots=max(args.concurrency), ctx=n_ctx)


def _embedded_target(
    args: argparse.Namespace, workload: Workload, sampling: SamplingSetup, closers: list[Any]
) -> tuple[Target, GGUFFile]:
    path = library().resolve(args.model or "default")
    n_ctx = args.ctx
    if n_ctx is None:
        tok = Tokenizer(path, first_loads=first_loads())
        try:
            n_ctx = _context_for(tok, workload, args.max_tokens)
        finally:
            tok.close()
    params = bench_load_params(args, n_ctx)
    model = Model(path, params, first_loads=first_loads())
    closers.append(model.close)
    if workload.images:
        _fit_images(model, workload, args)
    if params.n_seq_max == 1:
        return EmbeddedTarget(model, sampling), model.gguf
    return SchedulerTarget(model, sampling), model.gguf


def _fit_images(model: Model, workload: Workload, args: argparse.Namespace) -> None:
    """A model that reads the workload's images, with a context that holds them: the text
    tokenizer cannot count their tokens, the loaded projector can."""
    check_reads_images(model, workload)
    if args.ctx is not None:
        return
    need = round_context(media_context_need(model, workload, args.max_tokens))
    loop = model.loop
    if need > loop.n_ctx_seq:
        loop.resize(loop.n_slots, need)


def _http_target(
    args: argparse.Namespace, sampling: SamplingSetup, closers: list[Any]
) -> tuple[Target, GGUFFile | None]:
    try:
        client = StreamingClient(
            args.url,
            api=args.api,
            api_key=args.api_key,
            model=args.server_model,
            timeout_s=args.timeout,
        )
    except ClientError as e:
        raise CliError(str(e)) from None
    if client.model is None:
        try:
            models = client.list_models()
        except ClientError:
            models = []  # unreachable or no list: the requests themselves will say why
        client.model = models[0] if models else None
    tokenizer: Tokenizer | None = None
    tok_ref = args.tokenizer
    if (
        tok_ref is None
        and client.model
        and client.model.endswith(".gguf")
        and Path(client.model).is_file()
    ):
        tok_ref = client.model  # llama.cpp servers often name the model by its path
    if tok_ref is not None:
        tokenizer = Tokenizer(library().resolve(tok_ref))
        closers.append(tokenizer.close)
    pid = args.server_pid or local_server_pid(client.url)
    target = HttpTarget(client, tokenizer=tokenizer, server_pid=pid, sampling=sampling)
    return target, tokenizer.gguf if tokenizer is not None else None


def _report(args: argparse.Namespace, result: BenchResult) -> int:
    if args.out is not None:
        try:
            args.out.write_text(result.to_json(), encoding="utf-8")
        except OSError as e:
            raise CliError(f"cannot write {args.out}: {e.strerror or e}") from None
    if args.plot is not None:
        from engine.bench.plot import plot_result

        try:
            plot_result(result, args.plot)
        except (OSError, ValueError) as e:
            raise CliError(f"cannot write the chart {args.plot}: {e}") from None
    if args.json:
        print_json(result.to_dict())
    else:
        t = result.target
        what = t.get("url") or t.get("file")
        print(
            f"{t.get('runtime', t['kind'])}: {what}  workload {result.workload.name}, "
            f"{result.config.requests_per_level} requests per level"
        )
        print(format_table(result))
    levels = result.levels
    if levels and all(lv.succeeded == 0 for lv in levels):
        return EXIT_ALL_FAILED
    return 130 if result.cancelled else 0


def _load_result(path: Path) -> BenchResult | QualityResult:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CliError(f"no such file: {path}") from None
    except (ValueError, UnicodeDecodeError):
        raise CliError(f"{path} is not JSON") from None
    try:
        if is_quality_result(data):
            return QualityResult.from_dict(data)
        return BenchResult.from_dict(data)
    except BenchError:
        raise CliError(f"{path} is not a Candlewick benchmark result") from None


def run_compare(args: argparse.Namespace) -> int:
    a, b = _load_result(args.a), _load_result(args.b)
    try:
        if isinstance(a, QualityResult) and isinstance(b, QualityResult):
            rows = compare_quality(a, b)
            text = format_quality_compare(rows, args.a.name, args.b.name)
        elif isinstance(a, BenchResult) and isinstance(b, BenchResult):
            rows = compare(a, b)
            text = format_compare(rows, args.a.name, args.b.name)
        else:
            raise BenchError("one is a quality result, the other a speed result")
    except BenchError as e:
        raise CliError(f"{e} ({args.a.name}, {args.b.name})") from None
    if args.compare_json:
        print_json(rows)
    else:
        print(text)
    return 0
