"""What a whisper.cpp model costs in memory, from its header, before it is loaded.

whisper.cpp (1.8, the version pywhispercpp binds) allocates, when a model is loaded and its
state created (`whisper_init_state`, which logs each figure):

- the weights: the tensors' bytes;
- three f16 caches: the decoder's self-attention over `n_text_ctx` (padded to 256), the
  cross-attention over the encoder's `n_audio_ctx` (padded to 256), and a one-layer pad
  cache as wide as the encoder;
- four compute buffers, one per graph (conv, encode, cross, decode), each sized by ggml's
  allocator for its largest step: the decode graph holds a logits row for every one of
  `n_text_ctx` tokens, which makes it the largest for the small models;
- on the host, `n_vocab x n_text_ctx` float logits reserved by the state.

When a transcription falls back to sampling at a higher temperature with several decoders
(whisper.cpp's own default: best of 5), the self-attention cache is made again for
`n_decoders + 2` sequences; `fallback` is that growth. Candlewick's transcriber
(engine.speech.transcriber) decodes greedily at temperature 0 without a fallback, so by
default there is none; `best_of` sizes it for a caller that falls back.

The compute buffers' sizes come from ggml's graph allocator, which has no closed form: the
terms below are the dominant tensors of each graph, with per-element byte counts and a fixed
part measured against whisper.cpp's own figures (flash attention on, its default). They
equal them, to the 0.01 MB it prints, for models of tiny, base, small and large-v3
dimensions; for a model much narrower than its mel bins (a test model, 64 wide) the
allocator packs the conv graph tighter and the conv figure is an upper bound, up to 3 MB
over (docs/model-manager.md has the table).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.model.whisper_file import WhisperFile, WhisperHParams

F16 = 2
F32 = 4
PAD = 256
# Measured (whisper.cpp 1.8.5, CPU): each graph's buffer has this much beyond its tensors.
GRAPH_FIXED = 1_590_000
WHISPER_CPP_BEST_OF = 5  # whisper_full_default_params' greedy.best_of, for a fallback


def _pad(n: int) -> int:
    return (n + PAD - 1) // PAD * PAD


@dataclass(frozen=True)
class WhisperMemory:
    weights: int
    kv_self: int
    kv_cross: int
    kv_pad: int
    compute_conv: int
    compute_encode: int
    compute_cross: int
    compute_decode: int
    logits: int  # host RAM the state reserves
    fallback: int  # the self-attention cache's growth when decoding falls back to best-of

    @property
    def kv(self) -> int:
        return self.kv_self + self.kv_cross + self.kv_pad

    @property
    def compute(self) -> int:
        return self.compute_conv + self.compute_encode + self.compute_cross + self.compute_decode

    @property
    def at_load(self) -> int:
        """What whisper.cpp holds once the model and its state are created."""
        return self.weights + self.kv + self.compute + self.logits

    @property
    def total(self) -> int:
        """The peak while transcribing (a fallback's larger cache included)."""
        return self.at_load + self.fallback


def whisper_memory(model: WhisperFile, *, best_of: int = 1) -> WhisperMemory:
    """The bytes whisper.cpp allocates for `model` on the CPU, by buffer."""
    return memory_of(model.hparams, model.weights_bytes, best_of=best_of)


def memory_of(h: WhisperHParams, weights: int, *, best_of: int = 1) -> WhisperMemory:
    """The same from the hyper-parameters alone and the weights' bytes (before a download:
    the file's size, which overstates them by its vocabulary and mel filters, about 0.6 MB)."""
    text_ctx, audio_ctx = _pad(h.n_text_ctx), _pad(h.n_audio_ctx)
    kv_self = 2 * F16 * h.n_text_layer * text_ctx * h.n_text_state
    decoders = max(1, best_of)
    factor = decoders + 2 if decoders > 1 else 1
    # conv: the mel input (f32) and its im2col copy (f16, three taps); the two convolutions'
    # outputs at the encoder's width (16 bytes an element over both).
    mel_frames = 2 * h.n_audio_ctx
    conv = (F32 + 3 * F16) * h.n_mels * mel_frames + 16 * h.n_audio_ctx * h.n_audio_state
    # encode, with flash attention: the residual stream, Q/K/V and the MLP's activations
    # measured at 28 bytes per (frame, width) element.
    encode = 28 * h.n_audio_ctx * h.n_audio_state
    cross = F32 * h.n_audio_ctx * h.n_text_state
    decode = F32 * h.n_vocab * h.n_text_ctx + 2 * F32 * h.n_text_ctx * h.n_text_state
    return WhisperMemory(
        weights=weights,
        kv_self=kv_self,
        kv_cross=2 * F16 * h.n_text_layer * audio_ctx * h.n_text_state,
        kv_pad=2 * F16 * audio_ctx * h.n_audio_state,
        compute_conv=GRAPH_FIXED + conv,
        compute_encode=GRAPH_FIXED + encode,
        compute_cross=GRAPH_FIXED + cross,
        compute_decode=GRAPH_FIXED + decode,
        logits=F32 * h.n_vocab * h.n_text_ctx,
        fallback=kv_self * (factor - 1),
    )
