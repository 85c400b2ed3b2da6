"""Load a GGUF model on llama.cpp's low-level C API: its weights, its one context, its one
decode loop.

A `Model` is a file loaded once. It owns one llama.cpp context and the `Scheduler` whose thread
makes every decode on it (engine.host.scheduler); `generate`/`complete` and every other client
submit requests there. The high-level `Llama` class copies the whole logits row into numpy for
every token (15-21% of decode speed on a small model); the loop works on the C API, so
generation runs at the speed of llama.cpp itself (benchmarks/decode_overhead.py).

Tokenizing, templates and facts may be used from any thread; the context only from the loop.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.decoding import constraints
from engine.decoding.constraints import TokenMask
from engine.decoding.fim import FimTokens
from engine.errors import EngineError
from engine.host import model_build
from engine.host.generation import Generation
from engine.host.model_build import ProgressCallback, resolve_params
from engine.host.prompt_cache import PromptStateCache
from engine.host.scheduler import Scheduler
from engine.host.speculative import Speculator, draft_params
from engine.media.prompt import MediaPrompt, media_prompt
from engine.memory import cpu_kernels
from engine.memory import projector as projector_memory
from engine.memory.actual import ActualMemory, actual_from_log
from engine.memory.buffer_log import device_of
from engine.model.gguf import GGUFFile, read_gguf
from engine.model.projector_file import check_projector
from engine.model.semantics import check_model
from engine.model.templates import ChatTemplate
from engine.native import llama_lib
from engine.native.backend import LlamaBackend
from engine.native.lora import LoraAdapter, load_loras
from engine.native.projector import Media, Projector
from engine.settings import (
    LoadParams,
    SamplingParams,
    SpecMode,
    use_extra_buffers,
)

if TYPE_CHECKING:
    from engine.native.load_probe import FirstLoads


@dataclass(frozen=True)
class SpecialTokens:
    """The vocabulary's markers and which of them its tokenizer adds around a text
    (`llama_vocab_get_add_*`); an id of -1 (LLAMA_TOKEN_NULL): the vocabulary has none."""

    bos: int
    eos: int
    sep: int
    add_bos: bool
    add_eos: bool
    add_sep: bool


class Model:
    """A loaded model: its weights, one llama.cpp context and the one decode loop on it.

    `decode_loop=False` (a draft model): no loop of its own; the target's loop drives it."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        params: LoadParams | None = None,
        *,
        progress: ProgressCallback | None = None,
        cancel: threading.Event | None = None,
        gguf: GGUFFile | None = None,
        first_loads: FirstLoads | None = None,
        decode_loop: bool = True,
    ) -> None:
        """`first_loads`: try a file that never loaded before in a child process first
        (engine.native.load_probe), so that an abort inside llama.cpp cannot end this process."""
        self.first_loads = first_loads
        self.path = Path(path)
        self.gguf = gguf or read_gguf(self.path)
        check_model(self.gguf)  # an incoherent model can make llama.cpp abort the process
        self.params, self.embedding_only = resolve_params(params or LoadParams(), self.gguf)
        self._lib = C = llama_lib.lib()
        self._model: Any = None
        self._vocab: Any = None
        self._ctx: Any = None
        # The typed view every decode goes through (engine.native.backend); None unloaded.
        self.backend: LlamaBackend | None = None
        self.scheduler: Scheduler | None = None
        self.speculator: Speculator | None = None
        self._piece_buf = ctypes.create_string_buffer(256)
        self._grammar_lock = threading.Lock()
        self._grammar_tokenizer: Any = None
        # Snapshots of recent conversations' KV state, so switching back costs a memory copy.
        self.state_cache: PromptStateCache | None = (
            PromptStateCache(self.params.state_cache_mb << 20)
            if self.params.state_cache_mb > 0
            else None
        )
        # LoRA adapters loaded with the weights, and the scales requests get by default.
        self.loras: list[LoraAdapter] = []
        self.lora_scales: tuple[float, ...] = ()
        loaded = model_build.load(
            self.path,
            self.params,
            self.gguf,
            progress=progress,
            cancel=cancel,
            first_loads=first_loads,
        )
        self._model, self._vocab, self._ctx = loaded.model_ptr, loaded.vocab, loaded.ctx
        self._shape = loaded.shape
        self._limits()
        self.n_vocab = int(C.llama_vocab_n_tokens(self._vocab))
        self.memory_actual = loaded.memory_actual
        self.load_info = loaded.load_info
        self.amx_weights = loaded.amx_weights
        self.column_kernels = loaded.column_kernels
        self.flash_attn_on = loaded.flash_attn_on
        self.exactness = loaded.exactness
        self.split_rule = loaded.split_rule
        self.template = ChatTemplate(
            self.gguf.metadata.get("tokenizer.chat_template")
            if isinstance(self.gguf.metadata.get("tokenizer.chat_template"), str)
            else None,
            bos_token=self.token_text(C.llama_vocab_bos(self._vocab)),
            eos_token=self.token_text(C.llama_vocab_eos(self._vocab)),
        )
        # Images and audio, when a projector is loaded with the model (engine.media).
        self.projector: Projector | None = None
        try:
            if self.params.loras:  # their tensors sit beside the weights
                self.loras = load_loras(self._model, self.params.loras)
                assert self.backend is not None
                self.backend.loras = self.loras
                self.lora_scales = tuple(float(s) for _, s in self.params.loras)
                self.memory_actual = with_adapters(self.memory_actual, self.loras)
            if self.params.mmproj:
                mmproj = check_projector(self.params.mmproj).path
                if first_loads is not None:  # libmtmd aborts on some files: a child first
                    first_loads.probe_projector_unless_known(self.path, mmproj)
                self.projector = Projector(
                    self.params.mmproj,
                    self._model,
                    int(C.llama_model_n_embd_inp(self._model)),
                    n_threads=int(C.llama_n_threads_batch(self._ctx)),
                )
                if first_loads is not None:
                    first_loads.remember(mmproj)
                projector_memory.remember(mmproj, self.projector.sizes)
                self.memory_actual = replace(
                    self.memory_actual,
                    weights_bytes=self.memory_actual.weights_bytes
                    + self.projector.sizes.weights_bytes,
                    compute_bytes=self.memory_actual.compute_bytes
                    + self.projector.sizes.compute_bytes,
                )
            spec = self.params.speculative
            if spec is not None and spec.mode == "draft":
                assert spec.draft_model is not None
                self.speculator = Speculator(self, self._load_draft(spec.draft_model))
            if decode_loop:
                self.scheduler = Scheduler(self)
        except BaseException:
            self.close()
            raise

    def _load_draft(self, path: str) -> Model:
        """The draft model: a sequence per slot of this model's context, each as long."""
        draft = Model(
            path,
            draft_params(self.params, n_ctx=self.n_ctx, n_seq_max=int(self.params.n_seq_max)),
            first_loads=self.first_loads,
            decode_loop=False,
        )
        if draft.n_ctx_seq < self.n_ctx_seq:
            draft.close()
            raise EngineError(f"{Path(path).name} cannot hold this model's context as a draft")
        return draft

    # -- lifecycle -------------------------------------------------------------------------

    def _limits(self) -> None:
        C = self._lib
        self.n_ctx = int(C.llama_n_ctx(self._ctx))
        # What one sequence (one slot of the decode loop) holds: n_ctx / n_seq_max unless the
        # KV cache is unified.
        self.n_ctx_seq = int(C.llama_n_ctx_seq(self._ctx))
        # The most tokens one decode may take: min(requested n_ctx, n_batch).
        self.n_batch = int(C.llama_n_batch(self._ctx))
        self._memory = C.llama_get_memory(self._ctx)
        self.backend = LlamaBackend(
            self._ctx,
            self._vocab,
            int(C.llama_vocab_n_tokens(self._vocab)),
            adapt_threads=self.params.adapt_threads,
        )
        self.backend.loras = self.loras

    def recreate_context(self, n_seq_max: int, n_ctx: int) -> None:
        """A new context with `n_seq_max` sequences over `n_ctx` cells on the same weights
        (only KV and compute buffers change). Called by the decode loop while it is idle
        (`Scheduler.resize`). If llama.cpp refuses, the old settings are restored and
        EngineError says why."""
        C = self._lib
        old = (int(C.llama_n_ctx(self._ctx)), int(C.llama_n_seq_max(self._ctx)))
        C.llama_free(self._ctx)  # first: the old KV must not sit beside the new one
        self._ctx = None
        self.backend = None
        with llama_lib.capture_log() as lines:
            ctx = C.llama_init_from_model(self._model, self._shape.context_params(n_ctx, n_seq_max))
        if not ctx:
            why = llama_lib.last_error(lines)
            cp = self._shape.context_params(old[0], old[1])
            self._ctx = C.llama_init_from_model(self._model, cp)
            if self._ctx:
                self._limits()
            raise EngineError(
                f"llama.cpp could not make room for {n_seq_max} sequences of "
                f"{n_ctx // max(n_seq_max, 1)} tokens: {why}"
            )
        self._ctx = ctx
        self._limits()
        self.params = replace(self.params, n_ctx=n_ctx, n_seq_max=n_seq_max)
        new = actual_from_log(lines)
        self.memory_actual = replace(
            self.memory_actual,
            kv_bytes=new.kv_bytes,
            compute_bytes=new.compute_bytes,
            output_bytes=new.output_bytes or self.memory_actual.output_bytes,
        )
        if self.speculator is not None:
            self.speculator.recreate(n_seq_max, self.n_ctx_seq)

    def close(self) -> None:
        C = self._lib
        sched = getattr(self, "scheduler", None)
        if sched is not None:
            sched.close()  # ends requests in flight; nothing decodes after this
        spec = getattr(self, "speculator", None)
        if spec is not None:
            self.speculator = None
            spec.close()
        projector = getattr(self, "projector", None)
        if projector is not None:
            self.projector = None
            projector.close()
        if self._ctx:
            self.backend = None
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
        if self.params.drafting and not self.exactness.exact:
            return (
                "speculative decoding can take another branch where two words are "
                f"nearly tied ({self.exactness.reason})"
            )
        return ""

    @property
    def ctx_ptr(self) -> Any:
        return self._ctx

    @property
    def model_ptr(self) -> Any:
        return self._model

    @property
    def vocab_ptr(self) -> Any:
        return self._live_vocab()

    @property
    def memory_ptr(self) -> Any:
        return self._memory

    @property
    def loop(self) -> Scheduler:
        """The decode loop every request to this model goes through."""
        if self.scheduler is None or self.scheduler.closed or not self._ctx:
            raise EngineError(f"{self.path.name} has been unloaded")
        return self.scheduler

    # -- tokens ----------------------------------------------------------------------------

    def _live_vocab(self) -> Any:
        # llama.cpp dereferences the pointer it is given: a freed model would crash the process.
        if not self._vocab:
            raise EngineError(f"{self.path.name} has been unloaded")
        return self._vocab

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = True
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

    def special_tokens(self) -> SpecialTokens:
        C = self._lib
        vocab = self._live_vocab()
        return SpecialTokens(
            bos=int(C.llama_vocab_bos(vocab)),
            eos=int(C.llama_vocab_eos(vocab)),
            sep=int(C.llama_vocab_sep(vocab)),
            add_bos=bool(C.llama_vocab_get_add_bos(vocab)),
            add_eos=bool(C.llama_vocab_get_add_eos(vocab)),
            add_sep=bool(C.llama_vocab_get_add_sep(vocab)),
        )

    def fim_tokens(self) -> FimTokens:
        """The vocabulary's fill-in-the-middle markers, as llama.cpp read them (the GGUF's
        `tokenizer.ggml.fim_*_token_id`, else the tokens it recognised by their text)."""
        C = self._lib
        vocab = self._live_vocab()
        return FimTokens(
            pre=int(C.llama_vocab_fim_pre(vocab)),
            suf=int(C.llama_vocab_fim_suf(vocab)),
            mid=int(C.llama_vocab_fim_mid(vocab)),
            pad=int(C.llama_vocab_fim_pad(vocab)),
            rep=int(C.llama_vocab_fim_rep(vocab)),
            sep=int(C.llama_vocab_fim_sep(vocab)),
        )

    def named_template(self, name: str) -> str | None:
        """The file's template of that name (`tokenizer.chat_template.<name>`: a reranker's
        "rerank" prompt), as llama.cpp reads it; None when the file has none."""
        self._live_vocab()  # freed with the weights: refuse an unloaded model
        raw = self._lib.llama_model_chat_template(self._model, name.encode())
        return raw.decode("utf-8", errors="replace") if raw else None

    def special_token(self, text: str) -> int | None:
        """The id of `text` when it is one control or user-defined token of this vocabulary
        (a tool-call marker such as Qwen's `<tool_call>`), else None."""
        toks = self.tokenize(text, add_special=False, parse_special=True)
        if len(toks) != 1:
            return None
        attr = int(self._lib.llama_vocab_get_attr(self._live_vocab(), toks[0]))
        special = self._lib.LLAMA_TOKEN_ATTR_CONTROL | self._lib.LLAMA_TOKEN_ATTR_USER_DEFINED
        return toks[0] if attr & special else None

    def grammar_mask(self, grammar: str) -> TokenMask:
        """A fresh grammar state for one request (engine.decoding.constraints). The
        vocabulary's llguidance view is built on the first use and kept."""
        with self._grammar_lock:
            if self._grammar_tokenizer is None:
                vocab = self._live_vocab()
                eog = [t for t in range(self.n_vocab) if self._lib.llama_vocab_is_eog(vocab, t)]
                self._grammar_tokenizer = constraints.tokenizer_for(
                    self._lib, vocab, self.n_vocab, eog
                )
            tokenizer = self._grammar_tokenizer
        return TokenMask(tokenizer, grammar, self.n_vocab)

    # -- prompts ---------------------------------------------------------------------------

    def render_chat(self, messages: Sequence[Mapping[str, Any]], **extra: Any) -> str:
        """The prompt text of a chat; `extra`: template variables (`tools`,
        `enable_thinking`...)."""
        return self.template.render(messages, add_generation_prompt=True, **extra)

    def chat_tokens(self, messages: Sequence[Mapping[str, Any]], **extra: Any) -> list[int]:
        return self.chat_prompt_tokens(self.render_chat(messages, **extra))

    def chat_prompt_tokens(self, text: str) -> list[int]:
        """Tokens of a rendered chat prompt (its special tokens parsed as such)."""
        return self.tokenize(text, add_special=self._adds_bos(text), parse_special=True)

    def _adds_bos(self, text: str) -> bool:
        # Templates usually write the BOS token themselves; don't add a second one.
        bos = self.template.bos_token
        return not (bos and text.startswith(bos))

    def media_prompt(self, text: str, media: Sequence[Media]) -> MediaPrompt:
        """A rendered prompt with one `marker()` per image or audio clip of `media`, split
        by the projector into text and media chunks (engine.media.prompt)."""
        if self.projector is None:
            raise EngineError(
                f"{self.path.name} reads text only: load it with its projector (mmproj) "
                "to send images or audio"
            )
        return media_prompt(self.projector, text, media, add_special=self._adds_bos(text))

    # -- generation ------------------------------------------------------------------------

    def generate(
        self,
        messages: Sequence[Mapping[str, Any]],
        sampling: SamplingParams | None = None,
        *,
        cancel: threading.Event | None = None,
        spec: SpecMode | None = None,
        interactive: bool = True,
        media: Sequence[Media] = (),
    ) -> Generation:
        """Stream an assistant reply to a chat. Iterate the result for text pieces.
        `spec`: speculative decoding for this request (None: the model's setting).
        `media`: images and audio, one `marker()` each in the messages, in order."""
        if media:
            mp = self.media_prompt(self.render_chat(messages), media)
            return self.submit(
                mp.tokens, sampling, cancel=cancel, spec=spec, interactive=interactive, media=mp
            )
        return self.submit(
            self.chat_tokens(messages), sampling, cancel=cancel, spec=spec, interactive=interactive
        )

    def complete(
        self,
        prompt: str,
        sampling: SamplingParams | None = None,
        *,
        cancel: threading.Event | None = None,
        spec: SpecMode | None = None,
        interactive: bool = True,
        lora: dict[int, float] | None = None,
    ) -> Generation:
        """Stream a raw continuation of `prompt` (no chat template); `lora`: as `submit`."""
        kw: dict[str, Any] = {"spec": spec, "interactive": interactive, "lora": lora}
        return self.submit(self.tokenize(prompt), sampling, cancel=cancel, **kw)

    def submit(
        self,
        prompt: list[int],
        sampling: SamplingParams | None = None,
        *,
        cancel: threading.Event | None = None,
        spec: SpecMode | None = None,
        interactive: bool = True,
        media: MediaPrompt | None = None,
        lora: dict[int, float] | None = None,
    ) -> Generation:
        """Stream a reply to prompt token ids through the decode loop (`media`: the
        prompt's images and audio, its `tokens` the prompt; `lora`: adapter scales by id)."""
        return Generation(
            self.loop,
            prompt,
            sampling or SamplingParams(),
            cancel,
            interactive=interactive,
            spec=spec,
            media=media,
            lora=lora,
        )

    def reset_cache(self) -> None:
        """Drop every cached KV cell (waits for requests in flight)."""
        self.loop.clear_cache()

    def __repr__(self) -> str:
        return f"Model({self.path.name!r}, n_ctx={getattr(self, 'n_ctx', '?')})"


def drafting_exact(
    path: str | os.PathLike[str], extra_buffers: bool | None = None
) -> cpu_kernels.Exactness:
    """Whether speculative decoding of this model file on this build can give exactly plain
    decoding's tokens once flash attention is on (the weights' half of batch invariance)."""
    tensors = read_gguf(Path(path)).tensors
    return cpu_kernels.weights_exactness(
        tensors,
        cpu_kernels.detect(),
        extra_buffers=use_extra_buffers(extra_buffers),
        tied_output=cpu_kernels.tied_output(tensors),
    )


def with_adapters(actual: ActualMemory, loras: list[LoraAdapter]) -> ActualMemory:
    """`actual` with the adapters' buffers counted as weights, on their devices (what
    llama.cpp logged; the file's tensor bytes in RAM where it logged nothing)."""
    devices = dict(actual.devices)
    added = 0
    for a in loras:
        for buf, n in (a.buffers or {"CPU": a.tensor_bytes}).items():
            devices[device_of(buf)] = devices.get(device_of(buf), 0) + n
            added += n
    return replace(actual, weights_bytes=actual.weights_bytes + added, devices=devices)


__all__ = ["Model", "SpecialTokens", "drafting_exact", "with_adapters"]
