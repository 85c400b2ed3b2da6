"""A built web UI served at the server's own origin (`candlewick serve --webui DIR`): the
folder llama-server's web UI builds to (its tools/ui, `npm run build`), or any single-page
app that calls the API by relative paths. Its files are public, as llama-server serves its
UI: the API routes behind them still need the key."""

from __future__ import annotations

from pathlib import Path

from starlette.routing import Mount
from starlette.staticfiles import StaticFiles


def ui_paths(folder: str) -> frozenset[str]:
    """The URL paths of the folder's files, "/" (its index.html) included, read once at
    start: the only paths the key check lets through for it."""
    root = Path(folder)
    files = {"/" + p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    return frozenset({"/", *files})


def ui_mount(folder: str) -> Mount:
    """The folder at "/", after every route of the API (a route is never hidden by a
    file); a path that is neither is the 404 of a route the server lacks."""
    return Mount("/", app=StaticFiles(directory=folder, html=True), name="webui")


__all__ = ["ui_mount", "ui_paths"]
