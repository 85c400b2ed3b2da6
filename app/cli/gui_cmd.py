"""Start the desktop application (Qt is imported only here, when the window is wanted)."""

from __future__ import annotations


def start_gui() -> int:
    from app.main import run_app

    return run_app()
