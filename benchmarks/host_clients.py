"""One engine, many clients: what the shared model host costs and gives, as ratios measured in
one run (docs/benchmarks.md, "One engine, many clients").

    .venv/bin/python benchmarks/host_clients.py decode  [--tokens 128] [--pairs 5]
    .venv/bin/python benchmarks/host_clients.py share   [--tokens 128] [--rounds 3]
    .venv/bin/python benchmarks/host_clients.py memory  [--slots 4]
    .venv/bin/python benchmarks/host_clients.py ttft    [--ttft-requests 20]

decode   one request through the host (the decode loop, text, stop checks, events) vs the
         tightest C-API loop on the same context and thread (greedy sample + decode); and
         the product's default settings vs llama.cpp's own context defaults on a short prompt
         (each in a child process, alternating).
share    the chat streaming while the local server answers one request over HTTP, both on
         the one loaded model, against each alone; and the old design (a second instance of
         the file for the server, each decoding on its own thread) in a child process.
memory   RSS and llama.cpp's buffers when the local server takes its slots (a lease on the
         loop: the context recreated on the same weights), against loading a second instance.
ttft     where a short request's time to first token goes inside the host, in process, no
         HTTP (template, tokenizer, queue, prefill).

`candlewick serve` against llama-server, as users of each meet them, is
benchmarks/serving_defaults.py (which also runs `decode` with --engine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from app.services.library import bundled_default_model  # noqa: E402
from benchmarks.doc_tables import machine_line  # noqa: E402
from engine.host.runtime import Model  # noqa: E402
from engine.memory import hardware  # noqa: E402
from engine.native import llama_lib  # noqa: E402
from engine.settings import LoadParams, SamplingParams, default_threads  # noqa: E402

STORY = "Once upon a time, in a small village by the sea, there lived"
CHAT = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
SHORT = [{"role": "user", "content": "Say hello."}]


def model_path(arg: str | None) -> Path:
    path = Path(arg) if arg else bundled_default_model()
    if path is None:
        raise SystemExit("no model: pass --model or run `make setup`")
    return path


def ratio_line(name: str, a: list[float], b: list[float]) -> str:
    ratios = [x / y for x, y in zip(a, b, strict=True) if y]
    return (
        f"{name}: {statistics.median(a):.1f} vs {statistics.median(b):.1f} tok/s, "
        f"ratio {statistics.median(ratios):.3f} (pairs: "
        + ", ".join(f"{r:.3f}" for r in ratios)
        + ")"
    )


# -- decode -------------------------------------------------------------------------------


def reference_loop(model: Model, prompt: list[int], n_tokens: int) -> float:
    """Greedy sample + decode on the C API, nothing else; tokens/s after the first token."""
    C = llama_lib.lib()
    ctx = model.ctx_ptr
    C.llama_memory_clear(C.llama_get_memory(ctx), True)
    chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
    C.llama_sampler_chain_add(chain, C.llama_sampler_init_greedy())
    for i in range(0, len(prompt), 512):  # within any context's batch size
        chunk = prompt[i : i + 512]
        arr = (C.llama_token * len(chunk))(*chunk)
        C.llama_decode(ctx, C.llama_batch_get_one(arr, len(chunk)))
    tok = (C.llama_token * 1)()
    one = C.llama_batch_get_one(tok, 1)
    tok[0] = C.llama_sampler_sample(chain, ctx, -1)
    C.llama_decode(ctx, one)
    t0 = time.perf_counter()
    for _ in range(n_tokens - 1):
        tok[0] = C.llama_sampler_sample(chain, ctx, -1)
        C.llama_decode(ctx, one)
    C.llama_synchronize(ctx)
    dt = time.perf_counter() - t0
    C.llama_sampler_free(chain)
    return (n_tokens - 1) / dt


def story(repeat: int) -> str:
    return " ".join([STORY + " a fisherman."] * (repeat - 1) + [STORY])


def host_rate(model: Model, n_tokens: int, repeat: int = 1) -> float:
    """One request through the host; tokens/s between its first and last token."""
    model.reset_cache()
    gen = model.complete(
        story(repeat),
        SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=n_tokens, stop=()),
    )
    gen.consume()
    return gen.stats.gen_tps_wall


def child_decode(path: Path, mode: str, n_tokens: int, repeat: int) -> float:
    """In a fresh process: 'product' = Candlewick's default settings through the host;
    'llama' = llama.cpp's own default context parameters, the reference loop."""
    if mode == "product":
        with Model(path, LoadParams()) as m:
            host_rate(m, 16)  # warm-up
            return host_rate(m, n_tokens, repeat)
    C = llama_lib.lib()
    mp = C.llama_model_default_params()
    mp.use_extra_bufts = True
    model = C.llama_model_load_from_file(str(path).encode(), mp)
    cp = C.llama_context_default_params()  # llama.cpp's defaults: flash attention 'auto'...
    cp.n_ctx = LoadParams().n_ctx
    # ...but the threads Candlewick picks: llama.cpp's default of 4 oversubscribes 2 cores.
    cp.n_threads = cp.n_threads_batch = default_threads()
    ctx = C.llama_init_from_model(model, cp)
    vocab = C.llama_model_get_vocab(model)
    data = story(repeat).encode()
    buf = (C.llama_token * 4096)()
    n = C.llama_tokenize(vocab, data, len(data), buf, 4096, True, True)

    class Shim:  # what reference_loop needs of a Model
        ctx_ptr = ctx

    prompt = list(buf[:n])
    reference_loop(Shim(), prompt, 16)  # type: ignore[arg-type]
    rate = reference_loop(Shim(), prompt, n_tokens)  # type: ignore[arg-type]
    C.llama_free(ctx)
    C.llama_model_free(model)
    return rate


def child_rate(path: Path, mode: str, n_tokens: int, repeat: int) -> float:
    """`child_decode` in a fresh process (`child-decode`): its tokens/s."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "child-decode", "--mode", mode]
    cmd += ["--model", str(path), "--tokens", str(n_tokens), "--repeat", str(repeat)]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600)
    return float(r.stdout.strip().splitlines()[-1])


def decode(args: argparse.Namespace) -> dict[str, Any]:
    path = model_path(args.model)
    ref: list[float] = []
    host: list[float] = []
    with Model(path, LoadParams(n_ctx=2048)) as m:
        prompt = m.tokenize(STORY)
        host_rate(m, 16)
        for _ in range(args.pairs):
            # The reference runs on the loop's own thread, so both use the same OpenMP team.
            ref.append(m.loop.call_idle(lambda: reference_loop(m, prompt, args.tokens)))
            m.loop.clear_cache()
            host.append(host_rate(m, args.tokens))
    out: dict[str, Any] = {
        "host_vs_reference": ratio_line("host vs C-API loop", host, ref),
        "host": host,
        "reference": ref,
    }
    # A short prompt, and a long one (~1,900 tokens: a chat some turns in), where the CPU
    # flash-attention kernel slows down (engine.settings.resolve_flash_attn).
    for label, repeat in (("short", 1), ("long", 110)):
        product: list[float] = []
        llama: list[float] = []
        for _ in range(args.pairs):
            for mode, rates in (("product", product), ("llama", llama)):
                rates.append(child_rate(path, mode, args.tokens, repeat))
        out[f"defaults_{label}"] = ratio_line(
            f"product defaults vs llama.cpp defaults, {label} prompt", product, llama
        )
        out.setdefault("defaults_pairs", {})[label] = {"product": product, "llama": llama}
    return out


# -- share --------------------------------------------------------------------------------


def _serve(model: Model) -> tuple[Any, Any]:
    from engine.server import ServedModel, ServerConfig, ServerState, ServerThread

    loaded = ServedModel.build(model, "m", embeddings=False)
    state = ServerState(ServerConfig(port=0, model_id="m"))
    state.set_loaded(loaded)
    srv = ServerThread(state)
    srv.start()
    return srv, loaded


def _has_text(line: str) -> bool:
    """Whether an SSE line is a chunk with text (not the role-only first chunk)."""
    if not line.startswith("data: {"):
        return False
    choices = json.loads(line[6:]).get("choices") or [{}]
    return bool((choices[0].get("delta") or {}).get("content"))


def _api_stream(url: str, n_tokens: int, out: list[float]) -> None:
    """One streaming chat request; tokens/s between the first and last content chunk."""
    body = {
        "model": "m",
        "messages": CHAT,
        "max_tokens": n_tokens,
        "temperature": 0,
        "stream": True,
    }
    times: list[float] = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if _has_text(line):
                times.append(time.perf_counter())
    out.append((len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0)


def _chat(model: Model, n_tokens: int, out: list[float]) -> None:
    gen = model.generate(CHAT, SamplingParams(temperature=0, max_tokens=n_tokens))
    gen.consume()
    out.append(gen.stats.gen_tps_wall)


def _together(model: Model, url: str, n_tokens: int) -> tuple[float, float]:
    chat: list[float] = []
    api: list[float] = []
    t = threading.Thread(target=_api_stream, args=(url, n_tokens, api))
    t.start()
    time.sleep(0.05)
    _chat(model, n_tokens, chat)
    t.join()
    return chat[0], api[0]


def _put(b: Any, i: int, tok: int, pos: int, seq: int, logits: bool) -> None:
    """Row i of a raw llama_batch: the reference measures llama.cpp itself, not the backend."""
    b.token[i] = tok
    b.pos[i] = pos
    b.n_seq_id[i] = 1
    b.seq_id[i][0] = seq
    b.logits[i] = 1 if logits else 0


def raw_two_sequences(model: Model, steps: int = 60) -> float:
    """The ceiling: tokens/s of llama.cpp decoding 2 sequences a step over 1 sequence a step,
    straight on the C API on the model's context (run on its decode thread)."""
    C = llama_lib.lib()
    ctx = model.ctx_ptr
    mem = C.llama_get_memory(ctx)
    b = C.llama_batch_init(64, 0, 1)
    rate: dict[int, float] = {}
    for n in (1, 2):
        C.llama_memory_clear(mem, True)
        for seq in range(n):
            for i in range(40):
                _put(b, i, 100 + i, i, seq, False)
            b.n_tokens = 40
            C.llama_decode(ctx, b)
        t0 = time.perf_counter()
        for step in range(steps):
            for seq in range(n):
                _put(b, seq, 200, 40 + step, seq, True)
            b.n_tokens = n
            C.llama_decode(ctx, b)
        C.llama_synchronize(ctx)
        rate[n] = n * steps / (time.perf_counter() - t0)
    C.llama_batch_free(b)
    C.llama_memory_clear(mem, True)
    return rate[2] / rate[1]


def _share(chat_m: Model, server_m: Model, n_tokens: int) -> dict[str, float]:
    """The chat on `chat_m` and the server's one request on `server_m`: each alone, then
    together."""
    srv, loaded = _serve(server_m)
    try:
        _chat(chat_m, 16, [])
        chat_alone: list[float] = []
        api_alone: list[float] = []
        _chat(chat_m, n_tokens, chat_alone)
        _api_stream(srv.url, n_tokens, api_alone)
        chat, api = _together(chat_m, srv.url, n_tokens)
    finally:
        loaded.close()
        srv.stop()
    return {"chat_alone": chat_alone[0], "api_alone": api_alone[0], "chat": chat, "api": api}


def share_once(path: Path, n_tokens: int) -> dict[str, float]:
    """The shared host: the chat and the server's one request on one loaded model."""
    with Model(path, LoadParams(n_ctx=2048)) as m:
        m.loop.lease("server", 2, 2048, reserved_slots=1)
        try:
            out = _share(m, m, n_tokens)
            out["raw_two_sequences"] = m.loop.call_idle(lambda: raw_two_sequences(m))
            m.loop.clear_cache()  # the raw decodes bypassed the loop's bookkeeping
        finally:
            m.loop.release("server")
    return out


def child_share_two_instances(path: Path, n_tokens: int) -> dict[str, float]:
    """Before: the chat on its own instance, the server on a second one of the same file."""
    with (
        Model(path, LoadParams(n_ctx=2048)) as chat_m,
        Model(path, LoadParams(n_ctx=2048)) as server_m,
    ):
        return _share(chat_m, server_m, n_tokens)


def share(args: argparse.Namespace) -> dict[str, Any]:
    path = model_path(args.model)
    shared: list[dict[str, float]] = []
    before: list[dict[str, float]] = []
    for _ in range(args.rounds):
        r = subprocess.run(
            [
                sys.executable,
                __file__,
                "child-share",
                "--model",
                str(path),
                "--tokens",
                str(args.tokens),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        before.append(json.loads(r.stdout.strip().splitlines()[-1]))
        r = subprocess.run(
            [
                sys.executable,
                __file__,
                "child-share",
                "--shared",
                "--model",
                str(path),
                "--tokens",
                str(args.tokens),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        shared.append(json.loads(r.stdout.strip().splitlines()[-1]))

    def summary(rows: list[dict[str, float]]) -> dict[str, float]:
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        med["chat_ratio"] = statistics.median(r["chat"] / r["chat_alone"] for r in rows)
        med["api_ratio"] = statistics.median(r["api"] / r["api_alone"] for r in rows)
        med["sum_ratio"] = statistics.median((r["chat"] + r["api"]) / r["chat_alone"] for r in rows)
        return {k: round(v, 3) for k, v in med.items()}

    return {
        "shared": summary(shared),
        "two_instances": summary(before),
        "rows_shared": shared,
        "rows_two_instances": before,
    }


# -- memory -------------------------------------------------------------------------------


def memory(args: argparse.Namespace) -> dict[str, Any]:
    path = model_path(args.model)
    mib = 2**20
    with Model(path, LoadParams(n_ctx=4096)) as m:
        m.generate(SHORT, SamplingParams(max_tokens=4)).consume()
        rss0 = hardware.process_rss()
        a0 = m.memory_actual
        m.loop.lease("server", 1 + args.slots, 4096, reserved_slots=1)
        m.generate(SHORT, SamplingParams(max_tokens=4)).consume()
        rss1 = hardware.process_rss()
        a1 = m.memory_actual
        m.loop.release("server")
        rss2 = hardware.process_rss()
        with Model(path, LoadParams(n_ctx=4096 * args.slots, n_seq_max=args.slots)) as second:
            second.generate(SHORT, SamplingParams(max_tokens=4)).consume()
            rss3 = hardware.process_rss()
            a3 = second.memory_actual
    buffers = (a1.kv_bytes + a1.compute_bytes) - (a0.kv_bytes + a0.compute_bytes)
    return {
        "slots": args.slots,
        "lease_rss_growth_mib": round((rss1 - rss0) / mib, 1),
        "lease_buffer_growth_mib": round(buffers / mib, 1),
        "lease_weights_mib": round((a1.weights_bytes - a0.weights_bytes) / mib, 1),
        "after_release_rss_mib": round((rss2 - rss0) / mib, 1),
        "second_instance_rss_growth_mib": round((rss3 - rss2) / mib, 1),
        "second_instance_buffers_mib": round(a3.total_bytes / mib, 1),
    }


# -- ttft ---------------------------------------------------------------------------------


def ttft_breakdown(path: Path, n: int) -> dict[str, float]:
    """Where a short request's time to first token goes inside the host (no HTTP)."""
    with Model(path, LoadParams(n_ctx=1024)) as m:
        tmpl: list[float] = []
        ttft: list[float] = []
        queue: list[float] = []
        prefill: list[float] = []
        for i in range(n + 2):
            msgs = [{"role": "user", "content": f"Say hello. ({i})"}]
            t0 = time.perf_counter()
            tokens = m.chat_tokens(msgs)
            t1 = time.perf_counter()
            gen = m.submit(tokens, SamplingParams(temperature=0, max_tokens=4), interactive=False)
            gen.consume()
            if i >= 2:
                tmpl.append(t1 - t0)
                ttft.append(gen.stats.ttft_s)
                queue.append(gen.stats.queue_s)
                prefill.append(gen.stats.prompt_eval_ms / 1000)
    ms = 1000.0
    return {
        "template_and_tokenize_ms": round(statistics.median(tmpl) * ms, 2),
        "queue_ms": round(statistics.median(queue) * ms, 2),
        "prefill_ms": round(statistics.median(prefill) * ms, 2),
        "submit_to_first_token_ms": round(statistics.median(ttft) * ms, 2),
    }


def ttft(args: argparse.Namespace) -> dict[str, Any]:
    return ttft_breakdown(model_path(args.model), args.ttft_requests)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "what", choices=("decode", "share", "memory", "ttft", "child-decode", "child-share")
    )
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--ttft-requests", type=int, default=20)
    ap.add_argument("--mode", choices=("product", "llama"), default="product")
    ap.add_argument("--shared", action="store_true")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    if args.what == "child-decode":
        print(child_decode(model_path(args.model), args.mode, args.tokens, args.repeat))
        return 0
    if args.what == "child-share":
        fn = share_once if args.shared else child_share_two_instances
        print(json.dumps(fn(model_path(args.model), args.tokens)))
        return 0
    result = {"decode": decode, "share": share, "memory": memory, "ttft": ttft}[args.what](args)
    result["machine"] = machine_line()
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
