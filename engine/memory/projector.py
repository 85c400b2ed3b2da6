"""What a model's projector (an mmproj GGUF) costs: its weights and its encoder's compute
buffer, in RAM beside the model's own buffers.

No formula covers the encoders libmtmd builds (dozens of graph families), and libmtmd's own
no-alloc sizing is C++-only. The projector is small next to its model, so it is sized the
way the first-load protection loads it anyway: in a child process, for real, warmed up on
libmtmd's own input, reading the two sizes libmtmd logs (engine.native.load_probe). A file
is sized once per process (by path, size and modification time).
"""

from __future__ import annotations

import threading
from pathlib import Path

from engine.native.load_probe import ProjectorSizes, probe_projector

_cache: dict[tuple[str, int, int, str], ProjectorSizes] = {}
_lock = threading.Lock()


def projector_memory(model: str | Path, mmproj: str | Path) -> ProjectorSizes:
    """`mmproj`'s weights and compute buffer loaded for `model` (EngineError in one line
    when it cannot be loaded for it)."""
    p = Path(mmproj).resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns, str(Path(model).resolve()))
    with _lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    sizes = probe_projector(model, p)
    with _lock:
        _cache[key] = sizes
    return sizes


__all__ = ["projector_memory"]
