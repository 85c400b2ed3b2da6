"""`candlewick models quantize MODEL --type Q4_K_M`: a quant made locally, added to the library.

Progress goes to stderr (tensors written), the result to stdout: the new model's id, or with
`--json` the whole result. Ctrl+C stops it and leaves no file.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from app.cli.common import CliError, library, positive_int, print_json
from app.services.local_quants import quantize_model
from engine.model.gguf import human_bytes
from engine.model.quant_types import (
    QuantizeError,
    RequantizeRefused,
    quant_choices,
    quant_type_names,
)
from engine.model.quantize import read_source


def register(msub: Any) -> None:
    q = msub.add_parser(
        "quantize",
        help="make a smaller quantization of a model with llama.cpp and add it to the library",
        description=(
            "Quantize a model with llama.cpp's own quantizer. The new file goes beside its "
            "source (in the library folder for the bundled model, downloads and other tools' "
            "files) as <name>-<TYPE>.gguf. Types: " + ", ".join(quant_type_names())
        ),
    )
    q.add_argument("model", help="model id from `models list`, `default`, or a .gguf path")
    q.add_argument("--type", "-t", dest="qtype", metavar="TYPE", help="e.g. Q4_K_M, Q8_0")
    q.add_argument(
        "--list",
        action="store_true",
        help="list the types this model can be made into, with their sizes, and make none",
    )
    q.add_argument("--output", "-o", type=Path, help="the new file, or a folder for it")
    q.add_argument(
        "--allow-requantize",
        action="store_true",
        help="quantize an already quantized model again (worse than from its 16-bit original)",
    )
    q.add_argument("--threads", type=positive_int, help="threads (default: every core)")
    q.add_argument("--json", action="store_true", help="print the result as JSON")
    q.set_defaults(handler=quantize)


class _Progress:
    """Tensors written, on stderr: one updating line on a terminal, else a line a second."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self.last < (0.1 if self.tty else 1.0):
            return
        self.last = now
        line = f"quantizing {self.name}: {done}/{total} tensors ({100 * done // max(total, 1)}%)"
        if self.tty:
            end = "\n" if done >= total else ""
            print("\r" + line.ljust(72), end=end, file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)


def quantize(args: argparse.Namespace) -> int:
    lib = library()
    if args.list:
        return list_types(lib.resolve(args.model), as_json=args.json)
    if not args.qtype:
        raise CliError(f"choose a type with --type: {', '.join(quant_type_names())}")
    try:
        made = quantize_model(
            lib,
            args.model,
            args.qtype,
            output=args.output,
            allow_requantize=args.allow_requantize,
            progress=_Progress(args.model),
            threads=args.threads or 0,
        )
    except RequantizeRefused as e:
        raise CliError(f"{e}; add --allow-requantize to make it anyway") from None
    except QuantizeError as e:
        raise CliError(str(e)) from None
    except KeyboardInterrupt:
        print("\ncandlewick: quantizing stopped; no file was written", file=sys.stderr)
        return 130
    r = made.result
    if args.json:
        print_json({"id": made.entry.id, **r.to_dict()})
        return 0
    print(
        f"Made {r.output.name} ({r.qtype}, {human_bytes(r.size_bytes)}, "
        f"{r.bits_per_weight:.2f} bits per weight) in {r.seconds:.1f} s -> {r.output}",
        file=sys.stderr,
    )
    print(made.entry.id)
    return 0


_NOTES = {
    None: "",
    "requantize": "requantizes (--allow-requantize)",
    "not-smaller": "not smaller (--allow-requantize)",
}


def list_types(path: Path, *, as_json: bool) -> int:
    """The types `path` can be made into: bits per weight, the size before it is made."""
    try:
        choices = quant_choices(read_source(path), path.name)
    except QuantizeError as e:
        raise CliError(str(e)) from None
    if as_json:
        print_json(
            [
                {
                    "type": c.qtype.name,
                    "bits_per_weight": c.qtype.bits_per_weight,
                    "estimated_bytes": c.estimated_bytes,
                    "exact": c.exact,
                    "refusal": c.refusal,
                }
                for c in choices
            ]
        )
        return 0
    rows = [("TYPE", "BITS/WEIGHT", "SIZE", "NOTE")]
    for c in choices:
        size = ("" if c.exact else "~") + human_bytes(c.estimated_bytes)
        rows.append((c.qtype.name, f"{c.qtype.bits_per_weight:.2f}", size, _NOTES[c.refusal_kind]))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        line = "  ".join(x.ljust(w) for x, w in zip(r, widths, strict=False)) + "  " + r[3]
        print(line.rstrip())
    if not all(c.exact for c in choices):
        print("~: a mix of types, whose file may differ by a few percent", file=sys.stderr)
    return 0
