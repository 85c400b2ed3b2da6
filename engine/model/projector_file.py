"""A projector file checked before libmtmd reads it.

libmtmd loads tensor data with plain reads and does not notice a file cut short (a
projector truncated to a fifth of its size loaded, its weights partly missing), nor does it
say "this is a language model, not a projector" in words a user follows. The container is
validated by the project's own GGUF reader first, the same one every model goes through.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.errors import EngineError
from engine.model.gguf import GGUFError, read_gguf


@dataclass(frozen=True)
class ProjectorFile:
    path: Path
    projector_type: str  # clip.projector_type, e.g. "idefics3", "gemma3", "ultravox"
    vision: bool
    audio: bool
    weights_bytes: int  # the tensors' bytes, as libmtmd loads them


def check_projector(path: str | Path) -> ProjectorFile:
    """The file's projector facts, or EngineError in one line: missing, not GGUF, cut
    short, corrupt, a language model rather than a projector, or no encoder at all."""
    p = Path(path)
    if not p.is_file():
        raise EngineError(f"projector file not found: {p}")
    try:
        g = read_gguf(p, check_architecture=False)
    except GGUFError as e:
        raise EngineError(f"projector {e}") from None
    meta = g.metadata
    arch = meta.get("general.architecture")
    if arch != "clip":
        raise EngineError(f"{p.name} is not a projector (mmproj) file: it holds a {arch} model")
    vision = meta.get("clip.has_vision_encoder") is True
    audio = meta.get("clip.has_audio_encoder") is True
    if not vision and not audio:
        raise EngineError(f"{p.name} has neither a vision nor an audio encoder")
    kind = meta.get("clip.projector_type")
    for key in ("clip.vision.projector_type", "clip.audio.projector_type"):
        if not isinstance(kind, str):
            kind = meta.get(key)
    kind = kind if isinstance(kind, str) else "unknown"
    audio_kind = meta.get("clip.audio.projector_type", kind)
    if audio and audio_kind in STACKING_AUDIO:
        factor = meta.get("clip.audio.projector.stack_factor")
        if isinstance(factor, int) and factor > 0 and not stacks_evenly(factor):
            raise EngineError(
                f"{p.name} stacks {factor} audio frames, which this llama.cpp build counts "
                "one token short of what it makes (it would abort on the first clip); "
                "Candlewick refuses it rather than crash"
            )
    return ProjectorFile(p, kind, vision, audio, sum(t.n_bytes for t in g.tensors))


# Audio projectors that stack encoder frames (clip-model.h, audio_has_stack_frames).
STACKING_AUDIO = ("ultravox", "voxtral", "meralion")
WINDOW_FRAMES = 3000  # libmtmd's 30 s Whisper window of 10 ms mel frames


def stacks_evenly(factor: int) -> bool:
    """Whether clip.cpp's count of a window's tokens (its frames aligned to the stack
    factor, stacked, then halved by the convolution) equals what its graph makes (halved
    first, then aligned and stacked). Where they differ, clip_encode aborts the process
    ("Invalid number of output tokens")."""

    def align(n: int) -> int:
        return -(-n // factor) * factor

    return align(WINDOW_FRAMES) // factor // 2 == align(WINDOW_FRAMES // 2) // factor


__all__ = ["ProjectorFile", "check_projector", "stacks_evenly"]
