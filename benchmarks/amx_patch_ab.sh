#!/usr/bin/env bash
# The project's llama.cpp patch (installers/llama_cpp/amx_small_batch.patch) against the same
# llama.cpp without it, in the one venv: two builds of libggml-cpu swapped in between runs of
# a benchmark, the arms alternating for ROUNDS rounds, so both meet the machine's same moods.
#
#   benchmarks/amx_patch_ab.sh UNPATCHED_LIBGGML_CPU PATCHED_LIBGGML_CPU [ROUNDS] -- CMD...
#
# Build the unpatched one from the source release (pip download --no-binary :all: --no-deps
# llama-cpp-python==0.3.36, unpack, cmake with -DGGML_NATIVE=ON and the same
# -include installers/llama_cpp/amx_tilecfg.h flags, target ggml-cpu) and take the patched one
# from .venv (what `make setup` built). The venv keeps the library it had before.
set -euo pipefail
cd "$(dirname "$0")/.."
unpatched=$1 patched=$2
shift 2
rounds=4
if [ "${1:-}" != "--" ]; then rounds=$1; shift; fi
[ "${1:-}" = "--" ] && shift
lib=$(.venv/bin/python -c "import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).parent / 'lib')")
keep=$(mktemp)
cp "$lib/libggml-cpu.so" "$keep"
trap 'for f in "$lib"/libggml-cpu.so*; do cp "$keep" "$f"; done; rm -f "$keep"' EXIT
use() { for f in "$lib"/libggml-cpu.so*; do cp "$1" "$f"; done; }
for round in $(seq 1 "$rounds"); do
  for arm in unpatched patched; do
    if [ "$arm" = unpatched ]; then use "$unpatched"; else use "$patched"; fi
    echo "=== round $round: $arm ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))"
    "$@"
  done
done
