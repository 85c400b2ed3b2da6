"""A model file paired with its multimodal projector (an `mmproj` GGUF) in the same folder.

Vision and audio models come as two files: the language model and a projector that turns
images or audio into embeddings it reads (`engine.native.projector`). Hub repositories and LM
Studio keep them side by side, so a model is paired with a projector found next to it:

- a file is a projector when its name contains `mmproj` (llama.cpp's converter names them so);
- of several, the one whose precision best matches the model's: the same quantization label
  in the name (`-Q8_0`, `-F16`...) if one has it, else an F16 one (what the converter writes by
  default and what most repositories ship), else the first by name;
- a projector whose output width (`clip.vision.projection_dim` / `clip.audio.projection_dim`)
  is not the model's embedding width is not that model's (a folder of several models beside
  one projector pairs it only with the ones it fits), and an embedding model has none.

What a projector reads comes from its own GGUF metadata (`clip.has_vision_encoder`,
`clip.has_audio_encoder`), checked by `engine.model.projector_file.check_projector`; a file
that fails the check pairs as a projector with its one-line error and no capabilities, so a
broken projector is shown rather than silently ignored.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from engine.errors import EngineError
from engine.model.gguf import GGUFError, read_gguf
from engine.model.naming import file_stem, split_quantization
from engine.model.projector_file import check_projector

PROJECTOR_WORD = "mmproj"
# Precisions treated as the same label in a file name.
_SAME = {"FP16": "F16", "FP32": "F32"}


@dataclass(frozen=True)
class ProjectorInfo:
    """A model's projector: the file, what it reads, or why it cannot be used."""

    path: Path
    vision: bool = False
    audio: bool = False
    error: str | None = None
    width: int = 0  # the embedding width it writes (the text model's); 0: not stated

    @property
    def capabilities(self) -> tuple[str, ...]:
        """("vision", "audio") as the file has them; () for a broken one."""
        return tuple(n for n, has in (("vision", self.vision), ("audio", self.audio)) if has)


def is_projector_name(name: str) -> bool:
    """Whether a file name is a projector's (`mmproj-…gguf`, `…-mmproj-f16.gguf`)."""
    return PROJECTOR_WORD in name.lower() and name.lower().endswith(".gguf")


def _label(name: str) -> str:
    label = split_quantization(file_stem(name))[1]
    return _SAME.get(label, label)


def choose_projector(model: Path, candidates: Iterable[Path]) -> Path | None:
    """The projector of `model` among `candidates` (the rule in the module's docstring)."""
    found = sorted((p for p in candidates if is_projector_name(p.name)), key=lambda p: p.name)
    if not found:
        return None
    want = _label(model.name)
    if want:
        same = [p for p in found if _label(p.name) == want]
        if same:
            return same[0]
    f16 = [p for p in found if _label(p.name) == "F16"]
    return f16[0] if f16 else found[0]


def projector_beside(model: Path, width: int = 0) -> Path | None:
    """The projector in the model's folder, if there is one (`choose_projector`); `width`:
    the model's embedding width, which a projector that states its own must match."""
    try:
        siblings = [p for p in model.parent.iterdir() if p != model and is_projector_name(p.name)]
    except OSError:
        return None
    fits = [
        p for p in siblings if p.is_file() and (not width or projector_info(p).width in (0, width))
    ]
    return choose_projector(model, fits)


_cache: dict[tuple[str, int, int], ProjectorInfo] = {}


def projector_info(path: Path) -> ProjectorInfo:
    """What the projector at `path` reads (its header only; cached by size and time)."""
    try:
        st = path.stat()
    except OSError as e:
        return ProjectorInfo(path, error=f"cannot read {path.name}: {e.strerror}")
    key = (str(path), st.st_size, int(st.st_mtime))
    info = _cache.get(key)
    if info is None:
        try:
            facts = check_projector(path)
            meta = read_gguf(path, check_architecture=False).metadata
            dims = [meta.get(f"clip.{m}.projection_dim") for m in ("vision", "audio")]
            width = next((d for d in dims if isinstance(d, int) and d > 0), 0)
            info = ProjectorInfo(path, facts.vision, facts.audio, width=width)
        except (EngineError, GGUFError) as e:
            info = ProjectorInfo(path, error=str(e))
        _cache[key] = info
    return info


def pair(model: Path, width: int = 0) -> ProjectorInfo | None:
    """The projector paired with `model` (of embedding width `width`, 0: unknown) and what
    it reads (None: a text-only model)."""
    found = projector_beside(model, width)
    return None if found is None else projector_info(found)


__all__ = [
    "ProjectorInfo",
    "choose_projector",
    "is_projector_name",
    "pair",
    "projector_beside",
    "projector_info",
]
