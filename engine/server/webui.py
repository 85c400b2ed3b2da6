"""A built web UI served at the server's own origin (`candlewick serve --webui DIR`): the
folder llama-server's web UI builds to (its tools/ui, `npm run build`), or any single-page
app that calls the API by relative paths. Its files are public, as llama-server serves its
UI: the API routes behind them still need the key."""

from __future__ import annotations

from pathlib import Path

from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import Scope


def ui_paths(folder: str) -> frozenset[str]:
    """The URL paths of the folder's files, "/" (its index.html) included, read once at
    start: the only paths the key check lets through for it."""
    root = Path(folder)
    files = {"/" + p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    return frozenset({"/", *files})


class _UiFiles(StaticFiles):
    """The folder's files, read only: another method on a path that no route has is the
    404 of a route the server lacks, as without a UI (StaticFiles would say 405)."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        if scope["method"] not in ("GET", "HEAD"):
            raise HTTPException(status_code=404)
        return await super().get_response(path, scope)


def ui_mount(folder: str) -> Mount:
    """The folder at "/", after every route of the API (a route is never hidden by a
    file); a path that is neither is the 404 of a route the server lacks."""
    return Mount("/", app=_UiFiles(directory=folder, html=True), name="webui")


__all__ = ["ui_mount", "ui_paths"]
