"""QtMultimedia (PySide6-Addons), imported once for the whole window: the microphone
(voice_recorder.py) and spoken answers take it from here.

Loading it makes Qt look for PipeWire and warn on a system without it ("Couldn't load
pipewire-0.3 library"), although it then uses PulseAudio, which works. That warning says
nothing a user can act on, so its category is silenced before the first import. Where the
module cannot be imported at all (PySide6-Addons not installed, a bundle without it),
`MISSING` says why in one line and the window shows voice features disabled.
"""

from __future__ import annotations

from PySide6.QtCore import QLoggingCategory

QLoggingCategory.setFilterRules("qt.multimedia.symbolsresolver.warning=false")

try:
    from PySide6 import QtMultimedia

    MISSING: str | None = None
except ImportError as e:  # PySide6-Addons not installed, or its libraries not loadable
    QtMultimedia = None  # type: ignore[assignment]
    MISSING = f"Voice needs Qt Multimedia, which is not available here ({e})"

__all__ = ["MISSING", "QtMultimedia"]
