"""Check Candlewick's GPU code paths on a real GPU: detection, memory estimates, speed.

Each section runs in its own process (`gpu_check.py SECTION ...`), so a crash inside llama.cpp
(an abort cannot be caught) loses one section, not the run; scripts/gpu_check.sh runs them in
order and merges the JSON. Sections:

    hardware    what Candlewick detects vs NVML; the CUDA context's own memory
    memory      estimate (dry run, analytic) vs llama.cpp's buffers vs NVML, several settings
    edge        'auto' GPU layers at a context too big for the card, then a real load of it
    speed       single-stream prompt/decode speed; scheduler throughput at 1/4/8/16 requests
    spec        greedy output with and without prompt-lookup drafting (must be identical)
    dryrun      llama.cpp's no-alloc sizing with layers on the GPU (a child process there)

    python benchmarks/gpu_check.py SECTION --model big.gguf --out result.json

NVML figures are device-wide: nothing else may use the GPU meanwhile. Models with random weights
(benchmarks/synthetic_gguf.py) are fine for all of this: memory and speed depend on shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

T0 = time.perf_counter()
MiB = 1 << 20


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} +{time.perf_counter() - T0:5.1f}s] {msg}", flush=True)


class Nvml:
    """Device-wide used/free memory of GPU 0 (None everywhere when there is no NVML)."""

    def __init__(self) -> None:
        self.h: Any = None
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            self.nv = pynvml
            self.h = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception as e:  # no driver, no package: the figures are simply absent
            say(f"NVML unavailable: {e}")

    def mem(self) -> dict[str, int] | None:
        if self.h is None:
            return None
        m = self.nv.nvmlDeviceGetMemoryInfo(self.h)
        return {"total": int(m.total), "free": int(m.free), "used": int(m.used)}

    def used(self) -> int | None:
        m = self.mem()
        return m["used"] if m else None

    def info(self) -> dict[str, Any]:
        if self.h is None:
            return {}
        nv = self.nv
        out: dict[str, Any] = {
            "name": nv.nvmlDeviceGetName(self.h),
            "driver": nv.nvmlSystemGetDriverVersion(),
            "memory": self.mem(),
        }
        try:
            out["processes"] = [
                {"pid": p.pid, "used": p.usedGpuMemory}
                for p in nv.nvmlDeviceGetComputeRunningProcesses(self.h)
            ]
        except Exception as e:
            out["processes"] = str(e)
        return out

    def process_used(self) -> int | None:
        if self.h is None:
            return None
        try:
            for p in self.nv.nvmlDeviceGetComputeRunningProcesses(self.h):
                if p.pid == os.getpid():
                    return int(p.usedGpuMemory or 0)
        except Exception:
            return None
        return None


_BUF = re.compile(r"(\S+)\s+(model|KV|RS|compute|output) buffer size =\s*([\d.]+) MiB")


def buffers(lines: list[str]) -> list[dict[str, Any]]:
    """Every buffer llama.cpp logged: [{'buffer': 'CUDA0', 'kind': 'KV', 'bytes': ...}]."""
    out = []
    for line in lines:
        b = _BUF.search(line)
        if b:
            out.append(
                {"buffer": b.group(1), "kind": b.group(2), "bytes": round(float(b.group(3)) * MiB)}
            )
    return out


def interesting(lines: list[str]) -> list[str]:
    keys = (
        "flash_attn",
        "offload",
        "buffer size",
        "size =",
        "n_ctx",
        "CUDA",
        "fitting",
        "graph",
        "warn",
        "error",
        "fail",
    )
    return [ln.strip() for ln in lines if any(k in ln for k in keys)][:80]


def prompt_tokens(model: Any, n: int, salt: int = 0) -> list[int]:
    """About n tokens of ordinary text (distinct per salt)."""
    words = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "a",
        "lazy",
        "dog",
        "while",
        "seven",
        "wizards",
        "quietly",
        "judge",
        "boxing",
        "matches",
        "near",
        "the",
        "old",
        "harbour",
    ]
    text = " ".join(f"{words[(i * 7 + salt) % len(words)]}{(i + salt) % 97}" for i in range(n))
    toks: list[int] = model.tokenize(text)
    return toks[:n]


def timed_decode(model: Any, n_prompt: int, n_gen: int, salt: int = 0) -> dict[str, Any]:
    """Prompt of n_prompt tokens, then n_gen greedy tokens; llama.cpp's own timings."""
    from engine.settings import SamplingParams

    model.reset_cache()
    gen = model.submit(
        prompt_tokens(model, n_prompt, salt), SamplingParams(temperature=0, max_tokens=n_gen)
    )
    gen.consume()
    s = gen.stats
    return {
        "prompt_tokens": s.prompt_tokens,
        "prompt_tps": round(s.prompt_tps, 1),
        "gen_tokens": s.gen_tokens,
        "gen_tps": round(s.gen_tps, 1),
        "stop_reason": s.stop_reason,
        "ttft_s": round(s.ttft_s, 4),
    }


# -- sections --------------------------------------------------------------------------------


def sec_hardware(args: argparse.Namespace, nv: Nvml) -> dict[str, Any]:
    res: dict[str, Any] = {"nvml_before_cuda": nv.info()}
    from engine.memory import hardware
    from engine.native import llama_lib
    from engine.settings import resolve_flash_attn

    used0 = nv.used()
    t = time.perf_counter()
    hw = hardware.detect()
    res["detect_s"] = round(time.perf_counter() - t, 3)
    res["detect"] = hw.to_dict()
    res["llama_devices"] = [d.to_dict() for d in hardware.llama_devices()]
    res["nvml_devices"] = [d.to_dict() for d in hardware.nvml_devices()]
    res["system_info"] = llama_lib.system_info()
    res["supports_gpu_offload"] = llama_lib.supports_gpu_offload()
    res["ggml_lib"] = str(getattr(hardware.ggml_lib(), "_name", None))
    used1 = nv.used()
    # Memory the CUDA context (and ggml's device init) takes in this process, outside any
    # buffer llama.cpp reports.
    res["cuda_context_bytes"] = (used1 - used0) if used0 is not None and used1 is not None else None
    res["process_used_after_detect"] = nv.process_used()
    res["nvml_after_detect"] = nv.info()
    res["resolve_flash_attn"] = {
        "auto/f16": resolve_flash_attn("auto", "f16"),
        "auto/q8_0": resolve_flash_attn("auto", "q8_0"),
    }
    return res


def _estimates(path: Path, hw: Any, **kw: Any) -> dict[str, Any]:
    from engine.memory.estimate import estimate
    from engine.memory.params import EstimateParams
    from engine.settings import LoadParams

    out: dict[str, Any] = {}
    for method in ("dry-run", "analytic"):
        try:
            t = time.perf_counter()
            est = estimate(path, EstimateParams(LoadParams(**kw)), hardware=hw, method=method)  # type: ignore[arg-type]
            d = est.to_dict()
            d["seconds"] = round(time.perf_counter() - t, 3)
            out[method] = d
        except Exception as e:
            out[method] = {"error": f"{type(e).__name__}: {e}"}
    return out


def measure_load(
    path: Path,
    nv: Nvml,
    *,
    n_ctx: int,
    ngl: Any,
    type_k: str = "f16",
    type_v: str = "f16",
    n_seq_max: int = 1,
    decode: tuple[int, int] = (512, 64),
    flash_attn: str = "auto",
) -> dict[str, Any]:
    from engine.host.runtime import Model
    from engine.memory import hardware
    from engine.settings import LoadParams

    hw = hardware.detect()
    res: dict[str, Any] = {
        "n_ctx": n_ctx,
        "n_gpu_layers": ngl,
        "type_k": type_k,
        "type_v": type_v,
        "n_seq_max": n_seq_max,
        "flash_attn": flash_attn,
    }
    res["estimate"] = _estimates(
        path,
        hw,
        n_ctx=n_ctx,
        n_gpu_layers=ngl,
        type_k=type_k,
        type_v=type_v,
        n_seq_max=n_seq_max,
        flash_attn=flash_attn,
    )  # type: ignore[arg-type]
    used0 = nv.used()
    t = time.perf_counter()
    params = LoadParams(
        n_ctx=n_ctx,
        n_gpu_layers=ngl,
        type_k=type_k,
        type_v=type_v,
        n_seq_max=n_seq_max,
        flash_attn=flash_attn,  # type: ignore[arg-type]
        state_cache_mb=0,
    )
    try:
        m = Model(path, params)
    except Exception as e:
        res["load_error"] = f"{type(e).__name__}: {e}"
        return res
    try:
        res["load_s"] = round(time.perf_counter() - t, 2)
        res["gpu_layers_used"] = m.load_info.n_gpu_layers
        res["n_ctx_actual"] = m.n_ctx
        used_loaded = nv.used()
        res["buffers"] = buffers(m.load_info.log)
        res["actual"] = m.memory_actual.to_dict()
        res["log"] = interesting(m.load_info.log)
        if decode[0] or decode[1]:
            res["decode"] = timed_decode(m, decode[0], decode[1])
        used_run = nv.used()
        gpu_bufs = sum(
            b["bytes"]
            for b in res["buffers"]
            if b["buffer"].startswith("CUDA") and not b["buffer"].endswith("_Host")
        )
        res["nvml"] = {
            "before": used0,
            "loaded": used_loaded,
            "after_decode": used_run,
            "process_used": nv.process_used(),
        }
        if used0 is not None and used_loaded is not None and used_run is not None:
            res["nvml"]["delta_loaded"] = used_loaded - used0
            res["nvml"]["delta_after_decode"] = used_run - used0
            # What the GPU holds beyond llama.cpp's buffers: pools, cuBLAS, graphs.
            res["nvml"]["extra_loaded"] = used_loaded - used0 - gpu_bufs
            res["nvml"]["extra_after_decode"] = used_run - used0 - gpu_bufs
        res["gpu_buffers_bytes"] = gpu_bufs
    finally:
        m.close()
    res["nvml_after_close"] = nv.used()
    return res


def sec_memory(args: argparse.Namespace, nv: Nvml) -> dict[str, Any]:
    path = Path(args.model)
    configs: list[dict[str, Any]] = [
        {"n_ctx": 4096, "ngl": "all"},
        {"n_ctx": 32768, "ngl": "all"},
        {"n_ctx": 32768, "ngl": "all", "type_k": "q8_0", "type_v": "q8_0"},
        {"n_ctx": 4096, "ngl": "all", "type_k": "f16", "type_v": "q8_0"},
        {"n_ctx": 4096, "ngl": "all", "flash_attn": "off"},
        {"n_ctx": 16384, "ngl": "all", "n_seq_max": 4},
        {"n_ctx": 8192, "ngl": args.half_layers, "decode": (256, 32)},
        {
            "n_ctx": 32768,
            "ngl": args.half_layers,
            "type_k": "q8_0",
            "type_v": "q8_0",
            "decode": (256, 32),
        },
        {"n_ctx": 4096, "ngl": 0, "decode": (256, 16)},
    ]
    out = []
    for c in configs:
        c = dict(c)
        decode = c.pop("decode", (512, 64))
        if args.quick:
            decode = (16, 4)
        ngl = c.pop("ngl")
        say(f"memory: {c} ngl={ngl}")
        try:
            r = measure_load(path, nv, ngl=ngl, decode=decode, **c)
        except Exception as e:
            r = {"config": c, "error": f"{type(e).__name__}: {e}"}
        out.append(r)
        say(f"  -> {summary(r)}")
        if time.perf_counter() - T0 > args.budget:
            say("memory: out of time budget")
            break
    return {"configs": out}


def summary(r: dict[str, Any]) -> str:
    if "error" in r or "load_error" in r:
        return str(r.get("error") or r.get("load_error"))
    est = r["estimate"].get("dry-run", {})
    dev = {d["name"]: d["bytes"] for d in est.get("devices", [])}
    act = r.get("actual", {}).get("devices", {})
    nvml = r.get("nvml", {})
    return (
        f"est {_mb(dev)} actual {_mb(act)} nvml+{_m(nvml.get('delta_after_decode'))} "
        f"extra {_m(nvml.get('extra_after_decode'))} decode {r.get('decode')}"
    )


def _m(n: int | None) -> str:
    return "?" if n is None else f"{n / MiB:.0f}M"


def _mb(d: dict[str, int]) -> str:
    return "{" + ", ".join(f"{k}: {_m(v)}" for k, v in d.items()) + "}"


def sec_edge(args: argparse.Namespace, nv: Nvml) -> dict[str, Any]:
    """A context so long that not every layer fits: 'auto' must pick a count that loads."""
    from engine.host.model_build import resolve_gpu_layers
    from engine.memory import hardware
    from engine.memory.estimate import estimate
    from engine.memory.params import EstimateParams
    from engine.model.gguf import read_gguf
    from engine.settings import LoadParams

    path = Path(args.model)
    gf = read_gguf(path)
    n_layer = int(gf.arch_value("block_count", 0) or 0)
    res: dict[str, Any] = {}
    for n_ctx in args.edge_ctx:
        p = LoadParams(n_ctx=n_ctx, n_gpu_layers="auto", state_cache_mb=0)
        t = time.perf_counter()
        ngl = resolve_gpu_layers("auto", n_layer, gguf=gf, params=p)
        est = estimate(
            gf,
            EstimateParams(p),
            hardware=hardware.detect(),
            method="analytic",
        )
        res[str(n_ctx)] = {
            "auto_layers": ngl,
            "resolve_s": round(time.perf_counter() - t, 3),
            "estimate": est.to_dict(),
        }
        say(f"edge: ctx {n_ctx} auto -> {ngl} layers, {est.verdict}: {est.reason}")
    if args.edge_load:
        n_ctx = args.edge_load
        say(f"edge: loading at ctx {n_ctx} with auto layers")
        res["load"] = measure_load(path, nv, n_ctx=n_ctx, ngl="auto", decode=(64, 8))
        res["free_after"] = nv.mem()
        say(f"  -> {summary(res['load'])}")
    return res


def sec_speed(args: argparse.Namespace, nv: Nvml) -> dict[str, Any]:
    from engine.host.requests import Event, Finished
    from engine.host.runtime import Model
    from engine.settings import LoadParams, SamplingParams

    path = Path(args.model)
    res: dict[str, Any] = {}
    with Model(path, LoadParams(n_ctx=4096, n_gpu_layers="all", state_cache_mb=0)) as m:
        n_p, n_g = (32, 8) if args.quick else (512, 256)
        runs = [timed_decode(m, n_p, n_g, salt=i) for i in range(3)]
        res["single"] = runs
        res["single_short_prompt"] = timed_decode(m, 16, n_g // 2)
        say(f"speed single: {runs}")
    levels = [lv for lv in (1, 4, 8, 16) if lv <= args.max_slots]
    n_slots = max(levels)
    with Model(
        path,
        LoadParams(n_ctx=1024 * n_slots, n_seq_max=n_slots, n_gpu_layers="all", state_cache_mb=0),
    ) as m:
        res["scheduler_log"] = interesting(m.load_info.log)
        sched = m.loop
        out = []
        for rnd in range(2):
            for lv in levels:
                done = threading.Event()
                tokens = [0]
                left = [lv]
                lock = threading.Lock()

                def on_event(
                    ev: Event,
                    tokens: list[int] = tokens,
                    left: list[int] = left,
                    lock: threading.Lock = lock,
                    done: threading.Event = done,
                ) -> None:
                    if isinstance(ev, Finished):
                        with lock:
                            tokens[0] += ev.stats.completion_tokens
                            left[0] -= 1
                            if left[0] == 0:
                                done.set()

                t = time.perf_counter()
                for i in range(lv):
                    sched.submit(
                        prompt_tokens(m, 64, salt=1000 * rnd + 37 * lv + i),
                        SamplingParams(temperature=0, max_tokens=args.sched_tokens),
                        on_event,
                    )
                done.wait(120)
                dt = time.perf_counter() - t
                out.append(
                    {
                        "round": rnd,
                        "requests": lv,
                        "tokens": tokens[0],
                        "seconds": round(dt, 3),
                        "tps": round(tokens[0] / dt, 1),
                    }
                )
                say(f"scheduler: {out[-1]}")
        res["scheduler"] = out
    return res


def sec_spec(args: argparse.Namespace, nv: Nvml) -> dict[str, Any]:
    from engine.host.runtime import Model
    from engine.settings import LoadParams, SamplingParams

    path = Path(args.model)
    res: dict[str, Any] = {}
    text = (
        "def add(a, b):\n    return a + b\n\n" * 6 + "Repeat the code above exactly, "
        "then explain it."
    )
    msgs = [{"role": "user", "content": text}]
    for fa in ("auto", "on"):
        with Model(
            path,
            LoadParams(
                n_ctx=4096,
                n_gpu_layers="all",
                flash_attn=fa,  # type: ignore[arg-type]
                state_cache_mb=0,
            ),
        ) as m:
            s = SamplingParams(temperature=0, max_tokens=args.spec_tokens)
            m.reset_cache()
            plain = m.generate(msgs, s)
            plain.consume()
            m.reset_cache()
            spec = m.generate(msgs, s, spec="lookup")
            spec.consume()
            first_diff = next(
                (
                    i
                    for i, (a, b) in enumerate(zip(plain.tokens, spec.tokens, strict=False))
                    if a != b
                ),
                None,
            )
            res[fa] = {
                "identical": plain.tokens == spec.tokens,
                "first_diff": first_diff,
                "plain_tokens": len(plain.tokens),
                "spec_tokens": len(spec.tokens),
                "plain_tps": round(plain.stats.gen_tps, 1),
                "spec_tps": round(spec.stats.gen_tps, 1),
                "drafted": spec.stats.draft_tokens,
                "accepted": spec.stats.draft_accepted,
            }
            say(f"spec fa={fa}: {res[fa]}")
    return res


def sec_dryrun(args: argparse.Namespace, nv: Nvml) -> dict[str, Any]:
    """llama.cpp's no-alloc sizing with layers on the GPU (the estimate dry-runs on the CPU)."""
    from engine.memory.dry_run import dry_run
    from engine.memory.params import EstimateParams
    from engine.settings import LoadParams

    path = Path(args.model)
    out = []
    for n_ctx, ngl, tk in (
        (4096, 999, "f16"),
        (32768, 999, "q8_0"),
        (8192, args.half_layers, "f16"),
        (4096, 0, "f16"),
    ):
        p = EstimateParams(LoadParams(n_ctx=n_ctx, type_k=tk, type_v=tk, flash_attn="auto"))
        used0 = nv.used()
        try:
            d = dry_run(path, p, n_gpu_layers=ngl)
            r: dict[str, Any] = {
                "n_ctx": n_ctx,
                "ngl": ngl,
                "type": tk,
                "kv": d.kv_bytes,
                "compute": d.compute,
                "output": d.output,
                "buffers": buffers(list(d.log)),
                "log": interesting(list(d.log)),
            }
        except Exception as e:
            r = {"n_ctx": n_ctx, "ngl": ngl, "error": f"{type(e).__name__}: {e}"}
        used1 = nv.used()
        r["nvml_delta"] = used1 - used0 if used0 is not None and used1 is not None else None
        out.append(r)
        say(f"dryrun ctx {n_ctx} ngl {ngl} {tk}: compute {r.get('compute')} kv {r.get('kv')}")
    return {"runs": out}


SECTIONS: dict[str, Callable[[argparse.Namespace, Nvml], dict[str, Any]]] = {
    "hardware": sec_hardware,
    "memory": sec_memory,
    "edge": sec_edge,
    "speed": sec_speed,
    "spec": sec_spec,
    "dryrun": sec_dryrun,
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("section", choices=sorted(SECTIONS))
    ap.add_argument("--model", default="")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--half-layers", type=int, default=16)
    ap.add_argument("--edge-ctx", type=int, nargs="*", default=[131072, 524288, 1048576])
    ap.add_argument("--edge-load", type=int, default=0)
    ap.add_argument("--max-slots", type=int, default=16)
    ap.add_argument("--sched-tokens", type=int, default=128)
    ap.add_argument("--spec-tokens", type=int, default=160)
    ap.add_argument("--quick", action="store_true", help="few tokens (a CPU rehearsal)")
    ap.add_argument("--budget", type=float, default=240.0, help="seconds for a section's loop")
    args = ap.parse_args()
    nv = Nvml()
    say(f"section {args.section} start")
    try:
        res = SECTIONS[args.section](args, nv)
    except Exception as e:
        import traceback

        traceback.print_exc()
        res = {"error": f"{type(e).__name__}: {e}"}
    res["seconds"] = round(time.perf_counter() - T0, 2)
    args.out.write_text(json.dumps(res, indent=1, default=str))
    say(f"section {args.section} done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
