"""What a model's projector (an mmproj GGUF) costs: its weights and its encoder's compute
buffer, in RAM beside the model's own buffers.

No formula covers the encoders libmtmd builds (dozens of graph families), and libmtmd's own
no-alloc sizing is C++-only. The projector is small next to its model, so it is sized the
way the first-load protection loads it anyway: in a child process, for real, warmed up on
libmtmd's own input, reading the two sizes libmtmd logs (engine.native.load_probe). A file
is sized once per process (by path, size and modification time), and a real load's own
sizes are kept the same way. Where no child may be started (the desktop's estimate runs as
the user moves a slider), a projector not sized yet counts its weights from its header.
"""

from __future__ import annotations

import threading
from pathlib import Path

from engine.model.projector_file import check_projector
from engine.native.load_probe import ProjectorSizes, probe_projector

_sized: dict[tuple[str, int, int], ProjectorSizes] = {}
_lock = threading.Lock()


def _key(mmproj: str | Path) -> tuple[str, int, int]:
    p = Path(mmproj).resolve()
    st = p.stat()
    return (str(p), st.st_size, st.st_mtime_ns)


def remember(mmproj: str | Path, sizes: ProjectorSizes) -> None:
    """Keep what a load of `mmproj` allocated (a real load, or the probe's)."""
    with _lock:
        _sized[_key(mmproj)] = sizes


def known(mmproj: str | Path) -> ProjectorSizes | None:
    """`mmproj`'s sizes if this process has loaded or sized it."""
    try:
        key = _key(mmproj)
    except OSError:
        return None
    with _lock:
        return _sized.get(key)


def projector_memory(model: str | Path, mmproj: str | Path) -> ProjectorSizes:
    """`mmproj`'s weights and compute buffer loaded for `model` (EngineError in one line
    when it cannot be loaded for it)."""
    hit = known(mmproj)
    if hit is not None:
        return hit
    sizes = probe_projector(model, mmproj)
    remember(mmproj, sizes)
    return sizes


def header_weights(mmproj: str | Path) -> int:
    """The weights' bytes as the file's tensor table gives them (no compute buffer)."""
    return check_projector(mmproj).weights_bytes


__all__ = ["header_weights", "known", "projector_memory", "remember"]
