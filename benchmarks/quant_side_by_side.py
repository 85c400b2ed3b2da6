"""Quants made locally (`candlewick models quantize`) side by side with llama.cpp's own
`llama-quantize`, from the same source, for the same types: the tensor types (tensor by
tensor), the file size in bytes, whether the files are identical, and the time each took.

`llama-quantize` is built from the llama.cpp that llama-cpp-python vendors:

    pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36
    tar xf llama_cpp_python-0.3.36.tar.gz && cd llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -B build -DLLAMA_CURL=OFF -DGGML_NATIVE=ON
    cmake --build build -j2 --target llama-quantize

then, from the repository:

    .venv/bin/python benchmarks/quant_side_by_side.py \\
        --llama-quantize LLAMA_CPP/build/bin/llama-quantize [--model default] \\
        [--types Q4_0,Q2_K,Q4_K_M] [--threads 2] [--write docs/benchmarks.md]

Both run with `--allow-requantize` (the bundled SmolLM2 is Q4_1) and the same thread count,
one after the other for each type, the order alternating between types.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gguf import GGUFReader

from app.services.library import ModelLibrary
from app.services.paths import AppPaths
from benchmarks.doc_tables import machine_line, replace_between
from engine.model.quantize import quantize_file

START, END = "<!-- quant-side-by-side:start -->", "<!-- quant-side-by-side:end -->"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _types(path: Path) -> dict[str, str]:
    return {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}


def _counts(types: dict[str, str]) -> str:
    counts: dict[str, int] = {}
    for t in types.values():
        counts[t] = counts.get(t, 0) + 1
    return ", ".join(f"{n} {t}" for t, n in sorted(counts.items(), key=lambda x: -x[1]))


def _llama_quantize(tool: Path, src: Path, out: Path, qtype: str, threads: int) -> float:
    cmd = [str(tool), "--allow-requantize", str(src), str(out), qtype, str(threads)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - t0


def _candlewick(src: Path, out: Path, qtype: str, threads: int) -> float:
    t0 = time.perf_counter()
    quantize_file(src, out, qtype, allow_requantize=True, threads=threads)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-quantize", type=Path, required=True)
    ap.add_argument("--model", default="default")
    ap.add_argument("--types", default="Q4_0,Q2_K,Q4_K_M")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--write", type=Path)
    args = ap.parse_args()
    src = ModelLibrary(AppPaths.default().models).resolve(args.model)
    rows = [
        "| type | llama-quantize: size (bytes) | Candlewick: size (bytes) | tensor types "
        "(both) | tensors of another type | files identical | seconds: llama-quantize / "
        "Candlewick |",
        "|---|---:|---:|---|---:|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for i, qtype in enumerate(args.types.split(",")):
            ref, ours = Path(tmp, f"ref-{qtype}.gguf"), Path(tmp, f"ours-{qtype}.gguf")
            if i % 2 == 0:
                t_ref = _llama_quantize(args.llama_quantize, src, ref, qtype, args.threads)
                t_ours = _candlewick(src, ours, qtype, args.threads)
            else:
                t_ours = _candlewick(src, ours, qtype, args.threads)
                t_ref = _llama_quantize(args.llama_quantize, src, ref, qtype, args.threads)
            ref_types, our_types = _types(ref), _types(ours)
            differ = sum(1 for n in ref_types if ref_types[n] != our_types.get(n))
            differ += len(set(our_types) ^ set(ref_types))
            same = _sha256(ref) == _sha256(ours)
            rows.append(
                f"| {qtype} | {ref.stat().st_size:,} | {ours.stat().st_size:,} | "
                f"{_counts(our_types)} | {differ} | {'yes' if same else 'no'} | "
                f"{t_ref:.1f} / {t_ours:.1f} |"
            )
            print(rows[-1], flush=True)
    table = "\n".join(rows)
    cmd = (
        "Source: "
        + src.name
        + f" ({src.stat().st_size:,} bytes), {args.threads} threads, both with "
        "`--allow-requantize`.\n\n" + table + "\n\n" + machine_line()
    )
    print(machine_line())
    if args.write:
        replace_between(args.write, START, END, cmd)


if __name__ == "__main__":
    main()
