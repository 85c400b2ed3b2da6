"""Load a GGUF model and generate from it on llama.cpp's low-level C API.

The high-level `Llama` class copies the whole logits row into numpy for every token; on a
small model that costs 15-21% of decode speed. Here the per-token work is four C calls
(sample, end-of-generation check, token-to-piece, decode) and a little string handling, so
generation runs at the speed of llama.cpp itself (benchmarks/decode_overhead.py).

A `Model` is used by one thread at a time; cancellation (`threading.Event`) may come from
any thread and is honoured before every token.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from engine.decoding.textstream import TextStream
from engine.errors import EngineError, LoadCancelled
from engine.host import batch_plan, decode_guard
from engine.host.prompt_cache import PromptStateCache, common_prefix
from engine.memory import cpu_kernels, hardware
from engine.memory import estimate as memory
from engine.model.gguf import GGUFFile, read_gguf
from engine.model.semantics import check_model
from engine.model.templates import ChatTemplate
from engine.native import llama_lib
from engine.native.native_load import NativeLoad
from engine.settings import (
    FLASH_TYPES,
    KV_TYPES,
    FlashAttn,
    GpuLayers,
    LoadParams,
    SamplingParams,
    default_threads,
    resolve_flash_attn,
    use_extra_buffers,
)

if TYPE_CHECKING:
    from engine.host.speculative import Speculator
    from engine.native.load_probe import FirstLoads

# Histories shorter than this are cheaper to re-process than to snapshot.
MIN_SNAPSHOT_TOKENS = 64
MIN_RESTORE_GAIN = 32


# "error": a remote stream that failed part-way (the partial text is kept; see engine.remote).
StopReason = Literal["stop", "length", "stop_string", "cancelled", "context_full", "error"]
MeasuredOn = Literal["engine", "client"]


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens reused from the KV cache, not processed again
    ttft_s: float = 0.0  # wall clock, request start -> first text piece
    prompt_tps: float = 0.0  # llama.cpp perf counters: prompt eval tokens / prompt eval time
    gen_tokens: int = 0
    gen_tps: float = 0.0  # llama.cpp perf counters: decoded tokens / decode time
    gen_tps_wall: float = 0.0  # wall clock between first and last token
    total_s: float = 0.0
    stop_reason: StopReason = "stop"
    prompt_eval_ms: float = 0.0
    eval_ms: float = 0.0
    n_prompt_eval: int = 0
    n_eval: int = 0
    # Speculative decoding: tokens proposed by the drafter and how many the model accepted.
    draft_tokens: int = 0
    draft_accepted: int = 0
    # Where the figures were measured: "engine" (llama.cpp's own counters, in this process) or
    # "client" (a remote server's stream, timed on arrival; prompt_tps and eval figures are
    # then 0 and gen_tps is the wall-clock rate between first and last chunk).
    measured_on: MeasuredOn = "engine"
    # Client-measured stats: the counts taken from the server's usage report rather than
    # counted here ("prompt_tokens", "gen_tokens"). A count not named is the number of chunks
    # received (gen_tokens) or unknown, left 0 (prompt_tokens).
    server_usage: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LoadInfo:
    path: str
    load_s: float
    n_ctx: int
    n_gpu_layers: int
    n_layer: int
    n_threads: int
    log: list[str] = field(default_factory=list)


ProgressCallback = Callable[[float], None]


class Model:
    """A loaded model with one llama.cpp context."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        params: LoadParams | None = None,
        *,
        progress: ProgressCallback | None = None,
        cancel: threading.Event | None = None,
        gguf: GGUFFile | None = None,
        first_loads: FirstLoads | None = None,
    ) -> None:
        """`first_loads`: try a file that never loaded before in a child process first
        (engine.native.load_probe), so that an abort inside llama.cpp cannot end this process."""
        self.params = params or LoadParams()
        self.params.validate()
        self.first_loads = first_loads
        self.path = Path(path)
        self.gguf = gguf or read_gguf(self.path)
        check_model(self.gguf)  # an incoherent model can make llama.cpp abort the process
        self._lib = C = llama_lib.lib()
        self._lock = threading.Lock()
        self._model: Any = None
        self._vocab: Any = None
        self._ctx: Any = None
        self._cached: list[int] = []  # tokens currently in sequence 0 of the KV cache
        # How many of them were evaluated the canonical way (engine.host.batch_plan): a prompt
        # that must be reproducible reuses the cache only that far.
        self._exact_len = 0
        self._piece_buf = ctypes.create_string_buffer(256)
        # Snapshots of recent conversations' KV state, so switching back costs a memory copy.
        self.state_cache: PromptStateCache | None = (
            PromptStateCache(self.params.state_cache_mb << 20)
            if self.params.state_cache_mb > 0 else None
        )
        t0 = time.perf_counter()
        rss0 = hardware.process_rss()

        mp = C.llama_model_default_params()
        n_layer = int(self.gguf.arch_value("block_count", 0) or 0)
        mp.n_gpu_layers = resolve_gpu_layers(self.params.n_gpu_layers, n_layer,
                                             gguf=self.gguf, params=self.params)
        mp.load_mode = C.LLAMA_LOAD_MODE_MMAP if self.params.use_mmap else C.LLAMA_LOAD_MODE_NONE
        mp.use_extra_bufts = extra = use_extra_buffers(self.params.extra_buffers)
        cpu = cpu_kernels.detect()
        tied = cpu_kernels.tied_output(self.gguf.tensors)
        # The weights' half of batch invariance decides whether drafting wants flash attention;
        # `exactness` (below, once flash attention is settled) is the whole guarantee.
        weights_exact = cpu_kernels.weights_exactness(self.gguf.tensors, cpu,
                                                      extra_buffers=extra, tied_output=tied)
        # AMX kernels in use: the verification cost curve differs (engine.host.speculative).
        self.amx_weights = extra and cpu.amx_int8

        def on_progress(p: float, _user: Any) -> bool:
            if cancel is not None and cancel.is_set():
                return False
            if progress is not None:
                with contextlib.suppress(Exception):  # a UI callback must not abort the load
                    progress(float(p))
            return True

        cb = C.llama_progress_callback(on_progress)
        mp.progress_callback = cb
        flash = resolve_flash_attn(self.params.flash_attn, self.params.type_v,
                                   drafting=self.params.drafting,
                                   batch_exact=weights_exact.exact)
        n_threads = self.params.n_threads or default_threads()
        cp = C.llama_context_default_params()
        cp.n_ctx = self.params.n_ctx
        cp.n_batch = self.params.n_batch
        cp.n_ubatch = min(self.params.n_ubatch, self.params.n_batch)
        cp.n_seq_max = self.params.n_seq_max
        cp.n_threads = n_threads
        cp.n_threads_batch = self.params.n_threads_batch or n_threads
        cp.flash_attn_type = FLASH_TYPES[flash]
        cp.type_k = KV_TYPES[self.params.type_k]
        cp.type_v = KV_TYPES[self.params.type_v]
        cp.embeddings = self.params.embeddings
        cp.no_perf = False
        if first_loads is not None:
            first_loads.probe_unless_known(_native_load(self.path, mp, cp))
        with llama_lib.capture_log() as lines:
            if extra and llama_lib.amx_build():
                self._model = _on_passing_thread(
                    lambda: C.llama_model_load_from_file(str(self.path).encode(), mp))
            else:
                self._model = C.llama_model_load_from_file(str(self.path).encode(), mp)
            if not self._model:
                if cancel is not None and cancel.is_set():
                    raise LoadCancelled("loading was cancelled")
                raise EngineError(f"llama.cpp could not load {self.path.name}: "
                                  f"{llama_lib.last_error(lines)}")
            self._vocab = C.llama_model_get_vocab(self._model)
            self._ctx = C.llama_init_from_model(self._model, cp)
            if not self._ctx:
                self.close()
                raise EngineError(f"llama.cpp could not create a context for {self.path.name}: "
                                  f"{llama_lib.last_error(lines)}")
        if first_loads is not None:
            first_loads.remember(self.path)
        self.n_ctx = int(C.llama_n_ctx(self._ctx))
        # What one sequence holds (n_ctx / n_seq_max unless the KV cache is unified); this
        # class decodes sequence 0 only, so its limits are this one.
        self.n_ctx_seq = int(C.llama_n_ctx_seq(self._ctx))
        # The most tokens one llama_decode may take: min(requested n_ctx, n_batch).
        self.n_batch = int(C.llama_n_batch(self._ctx))
        self.n_vocab = int(C.llama_vocab_n_tokens(self._vocab))
        self._memory = C.llama_get_memory(self._ctx)
        # What llama.cpp really allocated, for "estimated X, actual Y" (engine.memory).
        self.memory_actual = memory.actual_from_log(
            lines, rss_growth_bytes=hardware.process_rss() - rss0 if rss0 else None)
        self.load_info = LoadInfo(
            path=str(self.path),
            load_s=time.perf_counter() - t0,
            n_ctx=self.n_ctx,
            n_gpu_layers=mp.n_gpu_layers,
            n_layer=n_layer,
            n_threads=n_threads,
            log=list(lines),
        )
        # Whether greedy output is the same however tokens are batched, for these settings on
        # this build and CPU (engine.memory.cpu_kernels); tests and speculation rely on
        # nothing else.
        self.flash_attn_on = _flash_enabled(lines, flash)
        self.exactness = cpu_kernels.batch_exactness(
            self.gguf.tensors, cpu, extra_buffers=extra, flash_attn=self.flash_attn_on,
            type_k=self.params.type_k, type_v=self.params.type_v, gpu_layers=mp.n_gpu_layers,
            tied_output=tied)
        # Which ways of cutting a prompt into batches keep its logits (engine.host.batch_plan).
        self.split_rule = cpu_kernels.split_rule(
            self.gguf.tensors, cpu, extra_buffers=extra, flash_attn=self.flash_attn_on,
            type_k=self.params.type_k, type_v=self.params.type_v, gpu_layers=mp.n_gpu_layers,
            tied_output=tied)
        self.template = ChatTemplate(
            self.gguf.metadata.get("tokenizer.chat_template")
            if isinstance(self.gguf.metadata.get("tokenizer.chat_template"), str) else None,
            bos_token=self.token_text(C.llama_vocab_bos(self._vocab)),
            eos_token=self.token_text(C.llama_vocab_eos(self._vocab)),
        )
        self.speculator: Speculator | None = None
        if self.params.drafting:
            from engine.host.speculative import Speculator  # it imports this module

            assert self.params.speculative is not None
            try:
                self.speculator = Speculator(self, self.params.speculative)
            except BaseException:
                self.close()
                raise

    # -- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        C = self._lib
        spec = getattr(self, "speculator", None)
        if spec is not None:
            self.speculator = None
            spec.close()
        if self._ctx:
            C.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            C.llama_model_free(self._model)
            self._model = None
            self._vocab = None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    @property
    def repeat_caveat(self) -> str:
        """Why a reproducible request (temperature 0, a fixed seed) may still give another
        reply on another run; '' when it cannot (engine.host.batch_plan keeps the batching)."""
        if self.load_info.n_gpu_layers > 0:
            return "GPU kernels do not promise the same sums from one run to the next"
        if self.speculator is not None and not self.exactness.exact:
            return ("speculative decoding can take another branch where two words are "
                    f"nearly tied ({self.exactness.reason})")
        return ""

    @property
    def ctx_ptr(self) -> Any:
        return self._ctx

    @property
    def model_ptr(self) -> Any:
        return self._model

    # -- tokens ----------------------------------------------------------------------------

    def _live_vocab(self) -> Any:
        # llama.cpp dereferences the pointer it is given: a freed model would crash the process.
        if not self._vocab:
            raise EngineError(f"{self.path.name} has been unloaded")
        return self._vocab

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True
                 ) -> list[int]:
        C = self._lib
        vocab = self._live_vocab()
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (C.llama_token * cap)()
        n = C.llama_tokenize(vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (C.llama_token * cap)()
            n = C.llama_tokenize(vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        C = self._lib
        vocab = self._live_vocab()
        buf = self._piece_buf
        n = C.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
        if n < 0:
            bigger = ctypes.create_string_buffer(-n)
            n = C.llama_token_to_piece(vocab, token, bigger, len(bigger), 0, special)
            return bigger.raw[:n]
        return buf.raw[:n]

    def token_text(self, token: int) -> str:
        if token < 0:
            return ""
        return self.token_bytes(token, special=True).decode("utf-8", errors="replace")

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        return bool(self._lib.llama_vocab_is_eog(self._live_vocab(), token))

    # -- prompts ---------------------------------------------------------------------------

    def render_chat(self, messages: Sequence[Mapping[str, Any]]) -> str:
        return self.template.render(messages, add_generation_prompt=True)

    def chat_tokens(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        text = self.render_chat(messages)
        # Templates usually write the BOS token themselves; don't add a second one.
        bos = self.template.bos_token
        add_special = not (bos and text.startswith(bos))
        return self.tokenize(text, add_special=add_special, parse_special=True)

    # -- generation ------------------------------------------------------------------------

    def generate(
        self,
        messages: Sequence[Mapping[str, Any]],
        sampling: SamplingParams | None = None,
        *,
        cancel: threading.Event | None = None,
        token_source: TokenSource | None = None,
    ) -> Generation:
        """Stream an assistant reply to a chat. Iterate the result for text pieces."""
        t0 = time.perf_counter()
        return Generation(self, self.chat_tokens(messages), sampling or SamplingParams(),
                          cancel, t0, token_source)

    def complete(
        self,
        prompt: str,
        sampling: SamplingParams | None = None,
        *,
        cancel: threading.Event | None = None,
        token_source: TokenSource | None = None,
    ) -> Generation:
        """Stream a raw continuation of `prompt` (no chat template)."""
        t0 = time.perf_counter()
        return Generation(self, self.tokenize(prompt), sampling or SamplingParams(), cancel, t0,
                          token_source)

    def reset_cache(self) -> None:
        self._lib.llama_memory_clear(self._memory, True)
        self._cached = []
        self._exact_len = 0

    def _make_sampler(self, s: SamplingParams) -> Any:
        C = self._lib
        chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
        if s.repeat_penalty != 1.0:
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_penalties(
                self.n_vocab, s.repeat_last_n, s.repeat_penalty, 0.0, 0.0))
        if s.temperature <= 0:
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_greedy())
            return chain
        if s.top_k > 0:
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_top_k(s.top_k))
        if s.top_p < 1.0:
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_top_p(s.top_p, 1))
        if s.min_p > 0.0:
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_min_p(s.min_p, 1))
        C.llama_sampler_chain_add(chain, C.llama_sampler_init_temp(s.temperature))
        seed = s.seed if s.seed is not None else 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: random
        C.llama_sampler_chain_add(chain, C.llama_sampler_init_dist(seed & 0xFFFFFFFF))
        return chain

    def _prefill(self, tokens: list[int], cancel: threading.Event | None, *,
                 exact: bool = False) -> int:
        """Bring the KV cache to `tokens[:-1]` decoded + last token decoded with logits.

        Reuses the longest common prefix with what is already cached (a follow-up turn only
        processes its new tokens). `exact`: the logits must be those of any other evaluation
        of these tokens, so only the canonically evaluated part of the cache is reused and the
        rest is batched as `engine.host.batch_plan` says. Returns how many prompt tokens were
        reused.
        """
        C = self._lib
        n_common = common_prefix(self._cached, tokens)
        cache = self.state_cache
        if cache is not None:
            found = cache.best(tokens)
            if found is not None and found[1] > n_common + MIN_RESTORE_GAIN:
                # Another conversation's history is in the KV cache: keep it, bring ours back.
                self._save_state()
                state = cache.get(found[0])
                if state is not None and self._restore_state(found[0], state):
                    n_common = found[1]
            elif len(self._cached) - n_common >= MIN_SNAPSHOT_TOKENS:
                self._save_state()  # about to overwrite a long history we may come back to
        rule: cpu_kernels.SplitRule = self.split_rule if exact else "any"
        reusable = n_common if rule == "any" else min(n_common, self._exact_len)
        plan = batch_plan.plan(len(tokens), reusable, self.n_batch, rule)
        n_common = plan.start
        if n_common < len(self._cached) and not C.llama_memory_seq_rm(
            self._memory, 0, n_common, -1
        ):
            # Some caches (sliding-window layers) cannot drop a partial sequence.
            C.llama_memory_clear(self._memory, True)
            plan = batch_plan.plan(len(tokens), 0, self.n_batch, rule)
            n_common = 0
        self._cached = tokens[:n_common]
        rest = tokens[n_common:]
        decode_guard.check_room(n_common, len(rest), self.n_ctx_seq)
        decode_guard.check_tokens(rest, self.n_vocab)
        # Positions decoded now are canonical only if this is an exact evaluation.
        self._exact_len = min(self._exact_len, n_common)
        pos = n_common
        for size in plan.sizes:
            if cancel is not None and cancel.is_set():
                raise _Cancelled
            chunk = tokens[pos : pos + size]
            arr = (C.llama_token * size)(*chunk)
            rc = C.llama_decode(self._ctx, C.llama_batch_get_one(arr, size))
            if rc != 0:
                self.reset_cache()
                raise EngineError(decode_guard.decode_error(rc))
            self._cached.extend(chunk)
            pos += size
        if exact and (len(tokens) > 1 or rule != "multi"):
            self._exact_len = len(tokens)
        return n_common

    def _save_state(self) -> None:
        cache = self.state_cache
        key = tuple(self._cached)
        if cache is None or len(key) < MIN_SNAPSHOT_TOKENS or cache.contains(key):
            return
        C = self._lib
        size = int(C.llama_state_seq_get_size(self._ctx, 0))
        if size <= 0 or size > cache.max_bytes:
            return
        buf = (ctypes.c_uint8 * size)()
        written = int(C.llama_state_seq_get_data(self._ctx, buf, size, 0))
        if written > 0:
            cache.put(key, bytes(buf)[:written], exact=min(self._exact_len, len(key)))

    def _restore_state(self, key: tuple[int, ...], state: bytes) -> bool:
        C = self._lib
        C.llama_memory_seq_rm(self._memory, 0, -1, -1)
        buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        if int(C.llama_state_seq_set_data(self._ctx, buf, len(state), 0)) == 0:
            C.llama_memory_clear(self._memory, True)
            self._cached = []
            self._exact_len = 0
            return False
        self._cached = list(key)
        cache = self.state_cache
        self._exact_len = cache.exact_prefix(key) if cache is not None else 0
        return True

    def __repr__(self) -> str:
        return f"Model({self.path.name!r}, n_ctx={getattr(self, 'n_ctx', '?')})"


class _Cancelled(Exception):
    pass


class Generation:
    """An in-progress reply: iterate for text pieces; `stats` is complete when exhausted."""

    def __init__(self, model: Model, prompt: list[int], sampling: SamplingParams,
                 cancel: threading.Event | None, t_start: float,
                 token_source: TokenSource | None = None) -> None:
        sampling.validate()
        if not model.ctx_ptr:
            raise EngineError(f"{model.path.name} has been unloaded")
        if not prompt:
            raise EngineError("the prompt is empty")
        if len(prompt) >= model.n_ctx_seq:
            raise EngineError(
                f"the prompt is {len(prompt)} tokens, the context holds {model.n_ctx_seq}; "
                "shorten the conversation or load the model with a larger context"
            )
        self.model = model
        self.prompt = prompt
        self.sampling = sampling
        self.cancel = cancel or threading.Event()
        self.stats = GenerationStats(prompt_tokens=len(prompt))
        self.text = ""
        self.tokens: list[int] = []
        self.done = False
        self._t_start = t_start
        # The model's own speculative setting applies unless the caller brings a source.
        if token_source is None and model.speculator is not None:
            token_source = model.speculator.token_source()
        self._token_source = token_source
        self._reason: StopReason = "length"
        self._prompt_perf: Any = None
        self._it = self._run()

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        return next(self._it)

    def consume(self) -> str:
        for _ in self:
            pass
        return self.text

    def _run(self) -> Iterator[str]:
        m = self.model
        if not m._lock.acquire(blocking=False):
            raise EngineError("the model is already generating")
        try:
            yield from self._loop()
        finally:
            m._lock.release()
            self.done = True

    def _loop(self) -> Iterator[str]:
        m = self.model
        C = m._lib
        s = self.sampling
        st = self.stats
        cancel = self.cancel
        ctx = m._ctx
        vocab = m._vocab
        # Account any decode still queued from an earlier request before zeroing the counters,
        # or llama.cpp adds it (and its start time) to this request's prompt figures.
        C.llama_synchronize(ctx)
        C.llama_perf_context_reset(ctx)
        chain = m._make_sampler(s)
        try:
            try:
                st.cached_tokens = m._prefill(self.prompt, cancel,
                                              exact=self.sampling.reproducible)
            except _Cancelled:
                st.stop_reason = "cancelled"
                self._finish(None, None)
                return
            # Snapshot the counters once the prompt is in: llama.cpp files every multi-token
            # decode under "prompt eval", so speculative verification batches would otherwise
            # be counted as prompt work.
            C.llama_synchronize(ctx)
            self._prompt_perf = C.llama_perf_context(ctx)
            if s.repeat_penalty != 1.0:
                for t in self.prompt[-s.repeat_last_n:]:
                    C.llama_sampler_accept(chain, t)

            stream = TextStream(s.stop)
            source = (self._token_source or _plain_tokens)(self, chain)
            buf = m._piece_buf
            buf_len = len(buf)
            to_piece = C.llama_token_to_piece
            max_tokens = s.max_tokens
            t_first: float | None = None
            t_last: float | None = None
            self._reason = "length"
            n_gen = 0
            try:
                for tok in source:
                    n = to_piece(vocab, tok, buf, buf_len, 0, False)
                    out = stream.push(buf.raw[:n] if n >= 0 else m.token_bytes(tok))
                    n_gen += 1
                    self.tokens.append(tok)
                    t_last = time.perf_counter()
                    if out:
                        if t_first is None:
                            t_first = t_last
                        self.text += out
                        yield out
                    if stream.stopped:
                        self._reason = "stop_string"
                        break
                    if n_gen >= max_tokens:
                        self._reason = "length"
                        break
            finally:
                source.close()  # lets the source put the KV cache in order
            tail = stream.flush()
            if tail:
                if t_first is None:
                    t_first = time.perf_counter()
                self.text += tail
                yield tail
            st.stop_reason = self._reason
            st.gen_tokens = n_gen
            self._finish(t_first, t_last)
        finally:
            C.llama_sampler_free(chain)

    def _finish(self, t_first: float | None, t_last: float | None) -> None:
        st = self.stats
        now = time.perf_counter()
        st.total_s = now - self._t_start
        st.ttft_s = (t_first - self._t_start) if t_first is not None else st.total_s
        C = self.model._lib
        C.llama_synchronize(self.model._ctx)
        perf = C.llama_perf_context(self.model._ctx)
        pre = self._prompt_perf if self._prompt_perf is not None else perf
        st.prompt_eval_ms = float(pre.t_p_eval_ms)
        st.n_prompt_eval = int(pre.n_p_eval)
        # Everything decoded after the prompt is generation, batched (verification) or not.
        st.eval_ms = float(perf.t_eval_ms) + float(perf.t_p_eval_ms) - st.prompt_eval_ms
        st.n_eval = int(perf.n_eval) + int(perf.n_p_eval) - st.n_prompt_eval
        # llama.cpp counts a single-token prompt decode as an eval, not a prompt eval.
        if st.n_prompt_eval and st.prompt_eval_ms > 0:
            st.prompt_tps = st.n_prompt_eval / (st.prompt_eval_ms / 1000)
        if st.draft_tokens and st.eval_ms > 0:
            # Speculative steps decode rejected drafts too: count the tokens that came out.
            st.gen_tps = st.gen_tokens / (st.eval_ms / 1000)
        elif st.n_eval and st.eval_ms > 0:
            st.gen_tps = st.n_eval / (st.eval_ms / 1000)
        if t_first is not None and t_last is not None and st.gen_tokens > 1 and t_last > t_first:
            st.gen_tps_wall = (st.gen_tokens - 1) / (t_last - t_first)


def _plain_tokens(gen: Generation, chain: Any) -> Generator[int, None, None]:
    """One token per step: sample, hand it out, decode it. The engine's hot loop.

    Ends by setting `gen._reason` (end of generation, cancel, full context). A consumer that
    stops early (max tokens, stop string) simply stops iterating: the last token handed out
    is then never decoded, and `model._cached` holds exactly what the KV cache holds.
    """
    m = gen.model
    C = m._lib
    ctx = m._ctx
    vocab = m._vocab
    cancel = gen.cancel
    sample = C.llama_sampler_sample
    is_eog = C.llama_vocab_is_eog
    decode = C.llama_decode
    tok_arr = (C.llama_token * 1)()
    batch = C.llama_batch_get_one(tok_arr, 1)
    cached = m._cached
    n_ctx = m.n_ctx_seq
    while True:
        if cancel.is_set():
            gen._reason = "cancelled"
            return
        tok = sample(chain, ctx, -1)
        if is_eog(vocab, tok):
            gen._reason = "stop"
            return
        yield tok
        if len(cached) + 1 >= n_ctx:
            gen._reason = "context_full"
            return
        tok_arr[0] = tok
        rc = decode(ctx, batch)
        if rc != 0:
            m.reset_cache()
            raise EngineError(decode_guard.decode_error(rc))
        cached.append(tok)


# A token source drives generation after the prompt: it yields token ids and keeps the KV
# cache and `model._cached` in step (speculative decoding plugs in here).
TokenSource = Callable[["Generation", Any], Generator[int, None, None]]





def _native_load(path: Path, mp: Any, cp: Any) -> NativeLoad:
    """The probe's copy of a real load's settings. Layers stay on the CPU: this llama.cpp's
    no-alloc load with offload crashes on CUDA builds (engine.memory.dry_run), and what a
    broken file trips over (header, vocabulary, tensors, the graph) is the same there."""
    return NativeLoad(
        path=str(path), n_gpu_layers=0, use_extra_bufts=bool(mp.use_extra_bufts),
        n_ctx=int(cp.n_ctx), n_batch=int(cp.n_batch), n_ubatch=int(cp.n_ubatch),
        n_seq_max=int(cp.n_seq_max), flash_attn_type=int(cp.flash_attn_type),
        type_k=int(cp.type_k), type_v=int(cp.type_v), embeddings=bool(cp.embeddings),
        swa_full=bool(cp.swa_full), kv_unified=bool(cp.kv_unified))


def _on_passing_thread(fn: Callable[[], Any]) -> Any:
    """Run `fn` on a thread that ends when it returns.

    Repacking weights for AMX runs on an OpenMP team that belongs to the calling thread and
    lives as long as it does. If that thread is not the one that decodes (a server's
    scheduler, the benchmark's), the process then has more OpenMP workers than cores, libgomp
    stops letting idle workers spin, and decoding runs several times slower (SmolLM2 through
    the scheduler: 24 t/s instead of 150). A loader thread that ends takes its team along.
    """
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as e:  # re-raised on the caller's thread
            box.append(e)

    t = threading.Thread(target=run, name="candlewick-load-weights")
    t.start()
    t.join()
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def drafting_exact(path: str | os.PathLike[str], extra_buffers: bool | None = None
                   ) -> cpu_kernels.Exactness:
    """Whether speculative decoding of this model file on this build can give exactly plain
    decoding's tokens once flash attention is on (the weights' half of batch invariance)."""
    tensors = read_gguf(Path(path)).tensors
    return cpu_kernels.weights_exactness(tensors, cpu_kernels.detect(),
                                         extra_buffers=use_extra_buffers(extra_buffers),
                                         tied_output=cpu_kernels.tied_output(tensors))


def _flash_enabled(lines: Sequence[str], resolved: FlashAttn) -> bool:
    """What llama.cpp did with flash attention ('auto' is its own choice), from its log."""
    for line in lines:
        if "flash_attn" in line and "=" in line:
            value = line.split("=", 1)[1].strip()
            if value in ("enabled", "disabled"):
                return value == "enabled"
    return resolved == "on"


def resolve_gpu_layers(requested: GpuLayers, n_layer: int, *, gguf: GGUFFile | None = None,
                       params: LoadParams | None = None) -> int:
    """Turn 'all'/'auto'/N into the layer count llama.cpp gets.

    'all' offloads every repeating layer plus the output layer (n_layer + 1). 'auto' offloads
    nothing on a build that cannot offload; otherwise, given the model header and settings, as
    many layers as fit in the GPUs' free memory minus a margin (engine.memory), else all.
    """
    if requested == "all":
        return n_layer + 1 if n_layer else 999
    if requested == "auto":
        if not llama_lib.supports_gpu_offload():
            return 0
        if gguf is not None and params is not None:
            return memory.fit_gpu_layers(gguf, memory.EstimateParams.from_load_params(params),
                                         hardware.detect())
        return n_layer + 1 if n_layer else 999
    return int(requested)


__all__ = [
    "Generation",
    "GenerationStats",
    "Model",
]
