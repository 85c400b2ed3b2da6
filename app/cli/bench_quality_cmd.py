"""`candlewick bench quality`: which quant should I run? Quants of one model scored against
the highest-precision file on a text (engine.bench.quality).

    candlewick bench quality --reference model-F16.gguf model-Q4_K_M.gguf model-Q2_K.gguf
    candlewick bench quality --reference model-Q8_0.gguf --make Q4_0 --make Q2_K --ctx 256
    candlewick bench quality --reference REF CAND --text notes.txt --json --out q.json
    candlewick bench quality --reference REF --make Q4_0 --make Q2_K --max-kld 0.05 --min-speed 50

The reference's scores are kept in the cache folder, so a later candidate costs one pass.
Exit codes: 0 done, 2 bad input, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

from app.cli.common import CliError, first_loads, library, positive_int, print_json
from app.services.atomic_write import write_text_atomic
from app.services.paths import AppPaths
from engine.bench.quality import QualitySetup, run_quality, scoring_load_params
from engine.bench.quality_pass import DEFAULT_BATCH, DEFAULT_CTX
from engine.bench.quality_report import format_quality_table
from engine.bench.quality_result import QualityResult
from engine.bench.quality_text import QualityText, builtin_text, file_text
from engine.bench.quant_choice import (
    CHOICE_KEY,
    QuantChoice,
    Thresholds,
    choose,
    format_choice_table,
    options_of,
)
from engine.host.runtime import Model
from engine.model.quant_types import QuantizeError, output_name, parse_quant_type
from engine.model.quantize import quantize_file


def register(sub: Any) -> None:
    """The `quality` sub-command of `bench` (`sub`: bench's sub-parsers)."""
    q = sub.add_parser(
        "quality",
        help="compare quants of a model with its reference: perplexity, KL divergence, top-1",
        description="Score candidate quants of one model against a reference file (its "
        "highest-precision file) on a text, as llama.cpp's llama-perplexity "
        "--kl-divergence does: perplexity, KL divergence (mean, median, 99th percentile), "
        "same top token, change of the next token's probability, and speed.",
    )
    q.add_argument(
        "--reference",
        required=True,
        metavar="REF",
        help="the reference: a .gguf path or a library id",
    )
    q.add_argument("candidates", nargs="*", help="candidate files (.gguf paths or library ids)")
    src = q.add_mutually_exclusive_group()
    src.add_argument(
        "--text", dest="q_text", type=Path, default=None, metavar="FILE", help="a UTF-8 text file"
    )
    src.add_argument(
        "--chat", dest="q_chat", type=int, default=None, metavar="ID", help="a saved chat's id"
    )
    src.add_argument(
        "--collection",
        dest="q_collection",
        default=None,
        metavar="NAME",
        help="a documents collection",
    )
    q.add_argument(
        "--ctx",
        dest="q_ctx",
        metavar="N",
        type=positive_int,
        default=DEFAULT_CTX,
        help=f"tokens per chunk; the second half of each is scored (default {DEFAULT_CTX})",
    )
    q.add_argument(
        "--batch",
        dest="q_batch",
        metavar="N",
        type=positive_int,
        default=DEFAULT_BATCH,
        help=f"tokens per decode, as llama.cpp's -b (default {DEFAULT_BATCH})",
    )
    q.add_argument(
        "--chunks",
        dest="q_chunks",
        type=positive_int,
        default=None,
        metavar="N",
        help="score at most N chunks",
    )
    q.add_argument(
        "--threads",
        dest="q_threads",
        type=positive_int,
        default=None,
        metavar="N",
        help="CPU threads (default: as a chat load)",
    )
    q.add_argument(
        "--make",
        dest="q_make",
        action="append",
        default=[],
        metavar="TYPE",
        help="a candidate quantized from the reference first (Q4_0, Q2_K...); repeatable",
    )
    q.add_argument(
        "--no-cache",
        dest="q_no_cache",
        action="store_true",
        help="score the reference again, and keep nothing",
    )
    q.add_argument(
        "--out", dest="q_out", type=Path, default=None, metavar="FILE", help="write the result JSON"
    )
    q.add_argument("--json", dest="q_json", action="store_true", help="print the JSON result")
    q.add_argument(
        "--max-kld",
        dest="q_max_kld",
        type=float,
        default=None,
        metavar="X",
        help="recommend a file: the smallest whose mean KL divergence is at most X, that fits "
        "in memory (and reaches --min-speed)",
    )
    q.add_argument(
        "--min-speed",
        dest="q_min_speed",
        type=float,
        default=None,
        metavar="T",
        help="recommend a file that generates at least T tokens/s (measured by chat replies, "
        "else predicted on this machine)",
    )
    q.add_argument("--quiet", "-q", dest="q_quiet", action="store_true", help="no progress")
    q.set_defaults(handler=run)


def _text(args: argparse.Namespace) -> QualityText:
    if args.q_text is not None:
        return file_text(args.q_text)
    if args.q_chat is not None:
        from app.cli.chats_cmd import open_store
        from app.services.quality_texts import chat_text

        with open_store() as chats:
            return chat_text(chats, args.q_chat)
    if args.q_collection is not None:
        from app.services.documents import open_documents
        from app.services.quality_texts import collection_text

        with open_documents() as docs:
            return collection_text(docs, args.q_collection)
    return builtin_text()


class _Progress:
    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self.stream, self.enabled, self.tty = stream, enabled, stream.isatty()

    def __call__(self, phase: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        line = f"{phase}: chunk {done}/{total}"
        if self.tty:
            self.stream.write("\r\033[K" + line + ("\n" if done == total else ""))
        elif done == total:
            self.stream.write(line + "\n")
        self.stream.flush()

    def note(self, line: str) -> None:
        if self.enabled:
            self.stream.write(line + "\n")
            self.stream.flush()


def _make_quants(
    reference: Path, types: list[str], folder: Path, progress: _Progress, cancel: threading.Event
) -> dict[Path, str]:
    """The quants of the reference asked for by --make, made once in the cache folder (keyed
    by the reference, so a changed reference makes them again)."""
    made: dict[Path, str] = {}
    st = reference.stat()
    tag = f"{st.st_size:x}{st.st_mtime_ns:x}"[-12:]
    folder.mkdir(parents=True, exist_ok=True)
    for name in types:
        try:
            qtype = parse_quant_type(name)
        except QuantizeError as e:
            raise CliError(str(e)) from None
        target = folder / f"{tag}-{output_name(reference, qtype)}"
        if not target.exists():
            progress.note(f"making {qtype.name} from {reference.name}...")
            quantize_file(reference, target, qtype, allow_requantize=True, cancel=cancel)
        made[target] = qtype.name
    return made


def run(args: argparse.Namespace) -> int:
    for flag, value in (("--max-kld", args.q_max_kld), ("--min-speed", args.q_min_speed)):
        if value is not None and not value >= 0:  # before any pass: NaN too
            raise CliError(f"{flag} must be a number of 0 or more, not {value}")
    lib = library()
    reference = lib.resolve(args.reference)
    candidates = [lib.resolve(c) for c in args.candidates]
    if not candidates and not args.q_make:
        raise CliError("name candidate files to compare with the reference, or --make TYPE")
    text = _text(args)
    bar = _Progress(sys.stderr, not args.q_quiet and not args.q_json)
    cancel = threading.Event()
    cache = AppPaths.default().cache / "quality"
    try:
        made = _make_quants(reference, args.q_make, cache / "quants", bar, cancel)
        setup = QualitySetup(
            ctx=args.q_ctx,
            n_batch=args.q_batch,
            max_chunks=args.q_chunks,
            cache_dir=None if args.q_no_cache else cache,
            made=made,
        )
        params = scoring_load_params(args.q_threads)
        loads = first_loads()

        def load(path: Path) -> Model:
            return Model(path, params, first_loads=loads)

        command = ["candlewick", *sys.argv[1:]] if sys.argv[1:2] == ["bench"] else None
        result = run_quality(
            reference,
            [*candidates, *made],
            text,
            setup,
            load=load,
            progress=bar,
            cancel=cancel,
            command=command,
        )
    except KeyboardInterrupt:
        cancel.set()
        raise
    choice = _choice(args, result)
    data = result.to_dict()
    if choice is not None:
        data[CHOICE_KEY] = choice.model_dump(mode="json")
    if args.q_out is not None:
        try:
            write_text_atomic(args.q_out, json.dumps(data, indent=1, ensure_ascii=False) + "\n")
        except OSError as e:
            raise CliError(f"cannot write {args.q_out}: {e.strerror or e}") from None
    if args.q_json:
        print_json(data)
    else:
        print(format_quality_table(result))
        if choice is not None:
            print()
            print(format_choice_table(choice))
    return 0


def _choice(args: argparse.Namespace, result: QualityResult) -> QuantChoice | None:
    """The recommendation, when --max-kld or --min-speed asks for one."""
    if args.q_max_kld is None and args.q_min_speed is None:
        return None
    from app.services.quant_facts import facts_of
    from app.services.speed_records import SpeedService

    speeds, memory = facts_of(result, SpeedService(AppPaths.default().data))
    thresholds = Thresholds(max_kld=args.q_max_kld, min_tokens_per_s=args.q_min_speed)
    return choose(options_of(result, speeds, memory), thresholds)


__all__ = ["register", "run"]
