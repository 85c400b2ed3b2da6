"""The desktop's model host catalog: the library's models, as models the host may load on
demand when an API request names one (the Local server serves from the app's host).

Qt-free. `library_catalog` is read on each lookup, so a download or import is seen at once;
the load settings come from a function of the library entry (the caller decides: the Local
server's slots, the library's saved settings for that file), with the entry's projector
(`LibraryEntry.mmproj`) added, so a paired model reads images and audio by name too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from app.services.library import LibraryEntry, ModelLibrary
from engine.errors import EngineError
from engine.host.host import Loadable
from engine.host.host_entry import HostedModel
from engine.settings import KV_TYPES, LoadParams

ParamsFor = Callable[[LibraryEntry], LoadParams]
CHAT_OWNER = "chat"  # who the chat's model belongs to in the app's host


def library_catalog(
    library: ModelLibrary,
    params: ParamsFor,
    *,
    loaded: Callable[[], Sequence[HostedModel]] | None = None,
) -> Callable[[], list[Loadable]]:
    """Every readable library model as a `Loadable` (id, the slug API clients see as an
    alias, the library's name as title). `loaded`: the host's models; a file already loaded
    there (the chat's) is listed under that model's name, so a request naming its library id
    reaches the loaded model instead of loading the file a second time."""

    def specs() -> list[Loadable]:
        by_path = _loaded_names(loaded() if loaded is not None else ())
        out = []
        for e in library.entries():
            if e.error is not None:
                continue
            given = params(e)
            if e.mmproj is not None and given.mmproj is None:
                # A paired model reads images and audio through the API too.
                given = dataclasses.replace(given, mmproj=e.mmproj)
            name = by_path.get(_real(e.path))
            if name is None:
                out.append(Loadable(e.id, e.path, given, aliases=(e.slug,), title=e.name))
            else:
                aliases = tuple(dict.fromkeys(a for a in (e.id, e.slug) if a != name))
                out.append(Loadable(name, e.path, given, aliases=aliases, title=e.name))
        return out

    return specs


def server_params(
    parallel: int, ctx_per_slot: int, saved: Mapping[str, Any] | None = None
) -> LoadParams:
    """What a model loaded on demand gets: the Local server's slots (`parallel` sequences of
    `ctx_per_slot` tokens), placed as the library's saved settings for the file say (GPU
    layers, KV cache types, flash attention). The saved context length is the chat's and
    speculation loads a second model: neither applies to a model the API asked for."""
    parallel = max(parallel, 1)
    base = LoadParams(n_ctx=max(ctx_per_slot, 16) * parallel, n_seq_max=parallel)
    if not saved:
        return base
    changes: dict[str, Any] = {}
    gpu = saved.get("gpu_layers")
    if gpu in ("auto", "all") or (isinstance(gpu, int) and not isinstance(gpu, bool) and gpu >= 0):
        changes["n_gpu_layers"] = gpu
    for key in ("type_k", "type_v"):
        if saved.get(key) in KV_TYPES:
            changes[key] = saved[key]
    if saved.get("flash_attn") in ("auto", "on", "off"):
        changes["flash_attn"] = saved["flash_attn"]
    params = dataclasses.replace(base, **changes)
    try:
        params.validate()  # a hand-edited file: the defaults rather than a failing load
    except EngineError:
        return base
    return params


def _loaded_names(hosted: Sequence[HostedModel]) -> dict[Path, str]:
    return {_real(h.path): h.name for h in hosted if h.path is not None}


def _real(path: Path) -> Path:
    try:
        return path.resolve()
    except OSError:
        return path


__all__ = ["CHAT_OWNER", "ParamsFor", "library_catalog", "server_params"]
