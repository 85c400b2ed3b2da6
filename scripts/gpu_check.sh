#!/usr/bin/env bash
# Build llama.cpp for CUDA and run benchmarks/gpu_check.py's sections on this machine's GPU.
#
#   scripts/gpu_check.sh OUTDIR
#
# Needs, in the repository root (prepared on any machine, see docs/gpu.md):
#   .gpu/llama.cpp.tar.xz  the llama.cpp source that llama-cpp-python vendors (trimmed)
#   .gpu/site/             pure-Python packages: llama_cpp (without its lib/), gguf, diskcache
#   .gpu/header.gguf       a tokenizer + chat template (benchmarks/synthetic_gguf.py header)
# and nvcc, cmake, ninja, python3 with numpy, jinja2, psutil, nvidia-ml-py.
# Settings: PY (python), WORK (build + models; kept between runs), SKIP_BUILD=1 with
# LIB=<dir of libllama.so> to use an existing build, CUDA_ARCH (default 90), BIG_PRESET (8b).
set -u
OUT=${1:?usage: scripts/gpu_check.sh OUTDIR}
PY=${PY:-python3}
WORK=${WORK:-$PWD/.gpuwork}
CUDA_ARCH=${CUDA_ARCH:-90}
BIG_PRESET=${BIG_PRESET:-8b}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT" "$WORK"
exec > >(tee -a "$OUT/log.txt") 2>&1
log() { echo "[$(date +%T) +${SECONDS}s] $*"; }
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/.gpu/site:$PWD"

log "start on $(hostname), $(nproc) cores"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || log "nvidia-smi failed"
nvcc --version | tail -2

# Models first, in the background: they only need numpy and gguf.
(
  set -e
  if [ ! -f "$WORK/big.gguf" ]; then
    $PY benchmarks/synthetic_gguf.py model --source .gpu/header.gguf --preset "$BIG_PRESET" \
      --out "$WORK/big.tmp"
    mv -f "$WORK/big.tmp" "$WORK/big.gguf"
  fi
) > "$WORK/models.log" 2>&1 &
MODELS=$!

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  SRC="$WORK/llama.cpp"
  [ -d "$SRC" ] || tar xJf .gpu/llama.cpp.tar.xz -C "$WORK"
  log "configure"
  cmake -S "$SRC" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=ON -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" > "$WORK/configure.log" 2>&1 \
    || { tail -30 "$WORK/configure.log"; log "configure FAILED"; exit 1; }
  log "build (ninja -j$JOBS)"
  B0=$SECONDS
  ninja -C "$WORK/build" -j"$JOBS" llama > "$WORK/build.log" 2>&1 \
    || { tail -40 "$WORK/build.log"; log "build FAILED"; exit 1; }
  log "build took $((SECONDS - B0)) s"
  LIB="$WORK/build/bin"
fi
export LLAMA_CPP_LIB_PATH="${LIB:?set LIB to the folder holding libllama.so}"
ls "$LIB"/*.so* | xargs -n1 basename | tr '\n' ' '; echo

log "waiting for models"
wait $MODELS || { cat "$WORK/models.log"; log "model generation FAILED"; exit 1; }
cat "$WORK/models.log"
ls -la "$WORK"/*.gguf

DEADLINE=${DEADLINE:-520}  # seconds since start after which no section starts
run() {  # section, extra args...
  local name=$1; shift
  local left=$((DEADLINE + 40 - SECONDS))
  if [ $left -lt 20 ]; then log "skip $name: out of time"; return; fi
  [ $left -gt "${SECTION_TIMEOUT:-200}" ] && left=${SECTION_TIMEOUT:-200}
  log "== $name (at most $left s)"
  timeout "$left" $PY benchmarks/gpu_check.py "$name" --out "$WORK/res-$name.json" "$@" \
    || log "section $name exited with $?"
  $PY - "$WORK" "$OUT/results.json" <<'EOF'
import json, pathlib, sys
work, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
res = {}
for f in sorted(work.glob("res-*.json")):
    try:
        res[f.stem[4:]] = json.loads(f.read_text())
    except ValueError as e:
        res[f.stem[4:]] = {"error": str(e)}
out.write_text(json.dumps(res, indent=1))
EOF
}

rm -f "$WORK"/res-*.json
run hardware
run memory --model "$WORK/big.gguf" ${MEMORY_ARGS:-}
run speed --model "$WORK/big.gguf" ${SPEED_ARGS:-}
run spec --model "$WORK/big.gguf" ${SPEC_ARGS:-}
run dryrun --model "$WORK/big.gguf"
run edge --model "$WORK/big.gguf" ${EDGE_ARGS:-}
log "done"
