"""The benchmark harness: one workload, several concurrency levels, any runtime.

A *target* runs one request and returns a `RequestTrace` (timestamps and token counts):

- `EmbeddedTarget` drives `engine.host.runtime.Model` in this process, one request at a time.
- `SchedulerTarget` drives the continuous-batching scheduler in this process (concurrency > 1).
- `HttpTarget` streams from any OpenAI- or Ollama-compatible server (`engine.remote.streaming`).

`run_benchmark` sends `requests` requests per level with at most `concurrency` in flight,
samples the serving process's peak memory, and turns the traces into `LevelMetrics`
(`engine.bench.metrics`). The result is a `BenchResult` (`engine.bench.result`); its text is
`engine.bench.report`'s.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as _dt
import itertools
import math
import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from engine.bench import media as bench_media
from engine.bench.hw import PeakSampler, machine_context, measure_read_bandwidth
from engine.bench.metrics import (
    LevelMetrics,
    RequestTrace,
    Roofline,
    level_metrics,
    max_concurrency_meeting_slo,
    percentile,
)
from engine.bench.result import (
    BenchError,
    BenchResult,
    RooflineReport,
    RunSettings,
    WorkloadInfo,
)
from engine.bench.workloads import Prompt, Workload
from engine.errors import EngineError
from engine.host.requests import Event as SchedulerEvent
from engine.host.requests import Finished, Piece, Request
from engine.host.runtime import Model
from engine.host.stats import GenerationStats
from engine.model.facts import model_facts
from engine.model.gguf import GGUFFile, read_gguf
from engine.model.semantics import check_model
from engine.model.templates import ChatTemplate
from engine.native import llama_lib
from engine.native.load_probe import FirstLoads
from engine.native.native_load import NativeLoad
from engine.remote.streaming import StreamingClient
from engine.settings import SamplingParams, use_extra_buffers

# -- targets ---------------------------------------------------------------------------------


class Target(Protocol):
    kind: str
    max_concurrency: int | None  # None: no limit known
    server_pid: int | None  # whose memory to sample; None: unknown (remote)

    def run(self, prompt: Prompt, max_tokens: int, cancel: threading.Event) -> RequestTrace: ...

    def describe(self) -> dict[str, Any]: ...


@dataclass
class SamplingSetup:
    temperature: float = 0.0
    seed: int | None = 1234


def _model_description(gf: GGUFFile, path: Path) -> dict[str, Any]:
    f = model_facts(gf)
    return {
        "name": f.name,
        "file": path.name,
        "architecture": f.architecture,
        "params": f.n_params,
        "quantization": f.quantization,
        "weights_bytes": f.size_bytes,
        "file_bytes": f.file_bytes,
        "context_length_trained": f.context_length,
    }


class EmbeddedTarget:
    """The embedded engine, sequential: each request starts from an empty KV cache so every
    prompt is processed in full (a benchmark that reuses a cached prefix flatters TTFT)."""

    kind = "embedded"
    max_concurrency: int | None = 1

    def __init__(self, model: Model, sampling: SamplingSetup | None = None) -> None:
        self.model = model
        self.sampling = sampling or SamplingSetup()
        self.server_pid: int | None = os.getpid()

    def run(self, prompt: Prompt, max_tokens: int, cancel: threading.Event) -> RequestTrace:
        sp = SamplingParams(
            temperature=self.sampling.temperature, seed=self.sampling.seed, max_tokens=max_tokens
        )
        t0 = time.perf_counter()
        t_first: float | None = None
        try:
            self.model.reset_cache()
            # Not interactive: a benchmark goes behind the chat, as an API client does.
            gen = self.model.generate(
                list(prompt.messages),
                sp,
                cancel=cancel,
                interactive=False,
                media=bench_media.pixels(prompt) if prompt.images else (),
            )
            for _piece in gen:
                if t_first is None:
                    t_first = time.perf_counter()
        except EngineError as e:
            return RequestTrace(
                index=0, t_start=t0, t_end=time.perf_counter(), error=str(e), token_source="engine"
            )
        t_end = time.perf_counter()
        st = gen.stats
        return RequestTrace(
            index=0,
            t_start=t0,
            t_end=t_end,
            t_first=t_first,
            prompt_tokens=st.prompt_tokens,
            completion_tokens=st.gen_tokens,
            error="cancelled" if st.stop_reason == "cancelled" else None,
            token_source="engine",
            finish_reason=st.stop_reason,
            engine_prompt_tps=st.prompt_tps or None,
            engine_gen_tps=st.gen_tps or None,
            **_media_stats(prompt, st),
        )

    def describe(self) -> dict[str, Any]:
        m = self.model
        d = _model_description(m.gguf, m.path)
        d.update(
            {
                "kind": self.kind,
                "runtime": "candlewick (embedded)",
                "n_ctx": m.n_ctx,
                "n_threads": m.load_info.n_threads,
                "n_gpu_layers": m.load_info.n_gpu_layers,
                "mode": "sequential",
            }
        )
        return d


class SchedulerTarget:
    """The embedded engine through the continuous-batching scheduler: concurrent requests
    share one context, as `candlewick serve` runs them."""

    kind = "embedded"

    def __init__(self, model: Model, sampling: SamplingSetup | None = None) -> None:
        self.model = model
        self.scheduler = scheduler = model.loop
        self.sampling = sampling or SamplingSetup()
        self.max_concurrency: int | None = int(scheduler.n_slots)
        self.server_pid: int | None = os.getpid()

    def run(self, prompt: Prompt, max_tokens: int, cancel: threading.Event) -> RequestTrace:
        sp = SamplingParams(
            temperature=self.sampling.temperature, seed=self.sampling.seed, max_tokens=max_tokens
        )
        done = threading.Event()
        first: list[float] = []
        finished: list[Finished] = []

        def on_event(ev: SchedulerEvent) -> None:
            if isinstance(ev, Finished):
                finished.append(ev)
                done.set()
            elif isinstance(ev, Piece) and ev.text and not first:
                first.append(time.perf_counter())

        t0 = time.perf_counter()
        try:
            req = self._submit(prompt, sp, on_event)
        except EngineError as e:
            return RequestTrace(
                index=0, t_start=t0, t_end=time.perf_counter(), error=str(e), token_source="engine"
            )
        while not done.wait(0.05):
            if cancel.is_set():
                req.cancel()
        t_end = time.perf_counter()
        st = finished[0].stats
        error = st.error or ("cancelled" if st.stop_reason == "cancelled" else None)
        return RequestTrace(
            index=0,
            t_start=t0,
            t_end=t_end,
            t_first=first[0] if first else None,
            prompt_tokens=st.prompt_tokens,
            completion_tokens=st.gen_tokens,
            error=error,
            timed_out=st.stop_reason == "timeout",
            token_source="engine",
            finish_reason=st.stop_reason,
            engine_prompt_tps=st.prompt_tps or None,
            engine_gen_tps=st.gen_tps or None,
            **_media_stats(prompt, st),
        )

    def _submit(
        self, prompt: Prompt, sp: SamplingParams, on_event: Callable[[SchedulerEvent], None]
    ) -> Request:
        messages = list(prompt.messages)
        if not prompt.images:
            return self.scheduler.submit(self.model.chat_tokens(messages), sp, on_event)
        mp = self.model.media_prompt(self.model.render_chat(messages), bench_media.pixels(prompt))
        try:  # the loop closes the media prompt when the request ends
            return self.scheduler.submit(mp.tokens, sp, on_event, media=mp)
        except BaseException:
            mp.close()
            raise

    def describe(self) -> dict[str, Any]:
        m = self.model
        d = _model_description(m.gguf, m.path)
        d.update(
            {
                "kind": self.kind,
                "runtime": "candlewick (embedded, continuous batching)",
                "n_ctx": m.n_ctx,
                "n_slots": self.max_concurrency,
                "n_threads": m.load_info.n_threads,
                "n_gpu_layers": m.load_info.n_gpu_layers,
                "mode": "scheduler",
            }
        )
        return d


class Tokenizer:
    """A model's tokenizer alone (llama.cpp `vocab_only`): counts tokens for servers that do
    not report usage, without loading any weights."""

    def __init__(
        self, path: str | os.PathLike[str], *, first_loads: FirstLoads | None = None
    ) -> None:
        self.path = Path(path)
        self.gguf = read_gguf(self.path)
        if first_loads is not None:  # a vocabulary llama.cpp aborts on would end the process
            check_model(self.gguf)
            first_loads.probe_unless_known(NativeLoad(str(self.path), n_ctx=256))
        C = self._C = llama_lib.lib()
        mp = C.llama_model_default_params()
        mp.vocab_only = True
        mp.use_extra_bufts = use_extra_buffers(None)
        with llama_lib.capture_log():
            self._model = C.llama_model_load_from_file(str(self.path).encode(), mp)
        if not self._model:
            raise BenchError(f"cannot read the tokenizer of {self.path.name}")
        self._vocab = C.llama_model_get_vocab(self._model)
        md = self.gguf.metadata
        tmpl = md.get("tokenizer.chat_template")
        self.template = ChatTemplate(
            tmpl if isinstance(tmpl, str) else None,
            bos_token=self._piece(C.llama_vocab_bos(self._vocab)),
            eos_token=self._piece(C.llama_vocab_eos(self._vocab)),
        )

    def _piece(self, token: int) -> str:
        if token < 0:
            return ""
        buf = ctypes.create_string_buffer(256)
        n = self._C.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, True)
        return buf.raw[: max(n, 0)].decode("utf-8", errors="replace")

    def count(self, text: str, *, special: bool = False) -> int:
        C = self._C
        data = text.encode("utf-8")
        n = C.llama_tokenize(self._vocab, data, len(data), None, 0, special, special)
        return abs(int(n))  # with no buffer llama.cpp returns minus the token count

    def count_chat(self, messages: Sequence[Mapping[str, Any]]) -> int:
        return self.count(self.template.render(messages, add_generation_prompt=True), special=True)

    def close(self) -> None:
        if self._model:
            self._C.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class HttpTarget:
    """Any OpenAI- or Ollama-compatible server. Token counts: the server's usage report, else
    the model's tokenizer (when known), else an estimate (one chunk = one token; ~4 characters
    a token for the prompt), and each trace says which."""

    kind = "url"
    max_concurrency: int | None = None

    def __init__(
        self,
        client: StreamingClient,
        *,
        tokenizer: Tokenizer | None = None,
        server_pid: int | None = None,
        sampling: SamplingSetup | None = None,
    ) -> None:
        self.client = client
        self.tokenizer = tokenizer
        self.server_pid = server_pid
        self.sampling = sampling or SamplingSetup()

    def run(self, prompt: Prompt, max_tokens: int, cancel: threading.Event) -> RequestTrace:
        messages: list[dict[str, Any]] = [dict(m) for m in prompt.messages]
        if prompt.images:
            to_api = (
                bench_media.ollama_messages
                if self.client.api == "ollama"
                else bench_media.openai_messages
            )
            messages = to_api(prompt)
        r = self.client.chat(
            messages,
            max_tokens=max_tokens,
            temperature=self.sampling.temperature,
            seed=self.sampling.seed,
            cancel=cancel,
        )
        prompt_tokens = r.prompt_tokens
        completion = r.completion_tokens
        source = "usage"
        if prompt_tokens is None or completion is None:
            if self.tokenizer is not None:
                source = "tokenizer"
                if prompt_tokens is None:
                    prompt_tokens = self.tokenizer.count_chat(prompt.messages)
                if completion is None:
                    completion = self.tokenizer.count(r.text)
            else:
                source = "estimate"
                if prompt_tokens is None:
                    chars = sum(len(m["content"]) for m in prompt.messages)
                    prompt_tokens = math.ceil(chars / 4)
                if completion is None:
                    completion = r.n_chunks
        error = r.error or ("cancelled" if r.cancelled else None)
        return RequestTrace(
            index=0,
            t_start=r.t_start,
            t_end=r.t_end,
            t_first=r.t_first,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion,
            error=error,
            timed_out=r.timed_out,
            token_source=source,
            finish_reason=r.finish_reason,
            images=len(prompt.images),  # what the server's projector did is not reported
        )

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "kind": self.kind,
            "runtime": f"{self.client.api} API server",
            "url": self.client.url,
            "api": self.client.api,
            "model_id": self.client.model,
            "server_pid": self.server_pid,
        }
        if self.tokenizer is not None:
            d.update(_model_description(self.tokenizer.gguf, self.tokenizer.path))
        return d


def _media_stats(prompt: Prompt, st: GenerationStats) -> dict[str, Any]:
    """A trace's image fields from a finished request's `GenerationStats`."""
    if not prompt.images:
        return {}
    return {
        "images": len(prompt.images),
        "media_tokens": st.media_tokens,
        "media_encoded": st.media_encoded,
        "media_encode_ms": st.media_encode_ms,
    }


def local_server_pid(url: str) -> int | None:
    """The pid listening on the URL's port when the host is this machine (None otherwise, or
    when the OS will not say, e.g. another user's process)."""
    from urllib.parse import urlsplit

    import psutil

    parts = urlsplit(url)
    if parts.hostname not in ("localhost", "127.0.0.1", "::1", "0.0.0.0"):
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                return int(c.pid)
    except (psutil.Error, OSError):
        return None
    return None


# -- running ---------------------------------------------------------------------------------


@dataclass
class Progress:
    concurrency: int
    level_index: int
    levels: int
    done: int  # requests finished in this level
    total: int
    failed: int
    phase: str = "run"  # warmup | run | bandwidth


ProgressCallback = Callable[[Progress], None]


@dataclass
class BenchConfig:
    concurrency: list[int] = field(default_factory=lambda: [1])
    requests: int = 8  # per level
    max_tokens: int | None = None  # cap on each prompt's own output length
    slo_ttft_s: float | None = None
    warmup: int = 1
    # Start every request with a unique tag so no runtime can serve it from a cached prompt
    # prefix (servers keep finished prompts in their KV cache; repeated prompts would flatter
    # TTFT). Off measures what prefix caching buys.
    unique_prompts: bool = True
    run_tag: str | None = None  # default: random, so repeated runs differ too
    measure_bandwidth: bool = True
    bandwidth_bytes: int = 512 << 20

    def validate(self) -> None:
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise BenchError("concurrency levels must be whole numbers of at least 1")
        if self.requests < 1:
            raise BenchError("requests must be at least 1")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise BenchError("max tokens must be at least 1")
        if self.slo_ttft_s is not None and self.slo_ttft_s <= 0:
            raise BenchError("the TTFT objective must be greater than 0 seconds")


def _max_tokens(prompt: Prompt, cap: int | None) -> int:
    return min(prompt.max_tokens, cap) if cap else prompt.max_tokens


def run_level(
    target: Target,
    prompts: Sequence[Prompt],
    concurrency: int,
    *,
    max_tokens_cap: int | None,
    cancel: threading.Event,
    on_done: Callable[[RequestTrace], None] | None = None,
) -> list[RequestTrace]:
    """Send every prompt with at most `concurrency` in flight; traces in request order."""
    traces: list[RequestTrace | None] = [None] * len(prompts)
    counter = itertools.count()
    lock = threading.Lock()

    def worker() -> None:
        while not cancel.is_set():
            with lock:
                i = next(counter)
            if i >= len(prompts):
                return
            p = prompts[i]
            try:
                tr = target.run(p, _max_tokens(p, max_tokens_cap), cancel)
            except Exception as e:  # a target bug must count as a failure, not end the run
                now = time.perf_counter()
                tr = RequestTrace(index=i, t_start=now, t_end=now, error=f"{type(e).__name__}: {e}")
            tr.index = i
            traces[i] = tr
            if on_done is not None:
                on_done(tr)

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="bench") as pool:
        # Submitting is inside the try: the first workers' requests are already in flight
        # while later ones are submitted, and a Ctrl+C there must cancel them too.
        try:
            futures = [pool.submit(worker) for _ in range(concurrency)]
            for f in futures:
                f.result()
        except BaseException:  # Ctrl+C: stop the requests in flight, don't wait them out
            cancel.set()
            raise
    return [t for t in traces if t is not None]


def tag_prompt(prompt: Prompt, tag: str) -> Prompt:
    """`prompt` with `[tag] ` before its first message: a different token from the start."""
    first, *rest = prompt.messages
    tagged = {**first, "content": f"[{tag}] {first['content']}"}
    return replace(prompt, messages=(tagged, *rest))


def bytes_per_token(gf: GGUFFile) -> int:
    """Weight bytes read to decode one token: every tensor, except that the token embedding
    matrix only has one row read when the model has a separate output matrix."""
    total = sum(t.n_bytes for t in gf.tensors)
    embd = gf.tensor("token_embd.weight")
    if embd is not None and gf.tensor("output.weight") is not None:
        total -= embd.n_bytes
    return total


def run_benchmark(
    target: Target,
    workload: Workload,
    config: BenchConfig,
    *,
    model_file: GGUFFile | None = None,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    command: Sequence[str] | None = None,
) -> BenchResult:
    """Run every concurrency level; a cancel keeps the levels already measured."""
    config.validate()
    cancel = cancel or threading.Event()
    limit = target.max_concurrency
    too_high = [c for c in config.concurrency if limit is not None and c > limit]
    if too_high:
        raise BenchError(
            f"this target runs at most {limit} request(s) at a time; "
            f"concurrency {too_high[0]} is not supported here"
        )
    levels = sorted(set(config.concurrency))
    run_tag = config.run_tag or secrets.token_hex(3)

    def level_prompts(li: int) -> list[Prompt]:
        # Each level starts further into the workload, so levels see different prompts.
        start = li * config.requests
        ps = workload.take(start + config.requests)[start:]
        if not config.unique_prompts:
            return ps
        return [tag_prompt(p, f"{run_tag}-{li}-{i}") for i, p in enumerate(ps)]

    prompts = level_prompts(0)
    started = _dt.datetime.now(_dt.UTC)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None

    for i in range(config.warmup):  # first requests pay for page faults and lazy init
        if cancel.is_set():
            break
        if progress:
            progress(Progress(levels[0], 0, len(levels), i, config.warmup, 0, "warmup"))
        p = workload.prompts[i % len(workload.prompts)]
        if config.unique_prompts:
            p = tag_prompt(p, f"{run_tag}-warmup-{i}")
        target.run(p, min(_max_tokens(p, config.max_tokens), 16), cancel)

    results: list[LevelMetrics] = []
    traces_by_level: dict[int, list[RequestTrace]] = {}
    for li, c in enumerate(levels):
        if cancel.is_set():
            break
        prompts = level_prompts(li)
        done: list[RequestTrace] = []
        lock = threading.Lock()

        def on_done(
            tr: RequestTrace,
            c: int = c,
            li: int = li,
            total: int = len(prompts),
            done: list[RequestTrace] = done,
            lock: threading.Lock = lock,
        ) -> None:
            with lock:
                done.append(tr)
                n, failed = len(done), sum(1 for t in done if not t.ok)
            if progress:
                progress(Progress(c, li, len(levels), n, total, failed))

        if progress:
            progress(Progress(c, li, len(levels), 0, len(prompts), 0))
        sampler = PeakSampler(target.server_pid) if target.server_pid else None
        with sampler or contextlib.nullcontext():
            traces = run_level(
                target, prompts, c, max_tokens_cap=config.max_tokens, cancel=cancel, on_done=on_done
            )
        lv = level_metrics(c, traces, slo_ttft_s=config.slo_ttft_s)
        if sampler is not None:
            lv.peak_ram_bytes = sampler.peak.ram_bytes
            lv.peak_vram_bytes = sampler.peak.vram_bytes
        ok = [t for t in traces if t.ok]
        lv.engine_prompt_tps_p50 = percentile(
            [t.engine_prompt_tps for t in ok if t.engine_prompt_tps], 50
        )
        lv.engine_gen_tps_p50 = percentile([t.engine_gen_tps for t in ok if t.engine_gen_tps], 50)
        results.append(lv)
        traces_by_level[c] = traces

    roofline: RooflineReport | None = None
    if config.measure_bandwidth and model_file is not None and not cancel.is_set():
        if progress:
            progress(Progress(levels[-1], len(levels), len(levels), 0, 1, 0, "bandwidth"))
        bw = measure_read_bandwidth(config.bandwidth_bytes)
        single = next((lv for lv in results if lv.concurrency == 1), None)
        achieved = single.gen_tps_p50 if single else None
        roofline = RooflineReport.of(
            Roofline(bw, bytes_per_token(model_file), achieved),
            note="bandwidth of system RAM; decode reads every weight once per token, so "
            "limit_tps = bandwidth / bytes_per_token. With layers on a GPU the GPU's "
            "bandwidth sets the limit instead.",
        )

    return BenchResult(
        created=started.isoformat(timespec="seconds"),
        finished=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        cancelled=cancel.is_set(),
        command=list(command) if command is not None else None,
        target=target.describe(),
        machine={**machine_context(), "load_avg_1m_before": load_before},
        workload=WorkloadInfo(
            name=workload.name,
            source=workload.source,
            prompts=len(workload.prompts),
            images=workload.images,
        ),
        config=RunSettings(
            concurrency=levels,
            requests_per_level=config.requests,
            max_tokens_cap=config.max_tokens,
            slo_ttft_s=config.slo_ttft_s,
            warmup=config.warmup,
            unique_prompts=config.unique_prompts,
        ),
        levels=results,
        max_concurrency_meeting_slo=max_concurrency_meeting_slo(results),
        roofline=roofline,
        traces=traces_by_level,
    )
