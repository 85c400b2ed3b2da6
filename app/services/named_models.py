"""The names an Ollama client gave models, kept across restarts: pulled Hub names, copies and
created models (engine.server.model_store.NamedModel), in one JSON file next to the library's
other records, written whole or not at all.

Qt-free and thread-safe: the server's worker threads read and write it. Another process
(`candlewick serve` beside the desktop's Local server) may change the file: it is read again
when its modification time changes.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

from app.services.atomic_write import write_text_atomic
from engine.server.model_store import NamedModel, full_name

log = logging.getLogger("candlewick.names")

FILE_NAME = "named-models.json"
VERSION = 1


def _to_json(m: NamedModel) -> dict[str, Any]:
    return {
        "name": m.name,
        "path": str(m.path),
        "base": m.base,
        "kind": m.kind,
        "system": m.system,
        "parameters": dict(m.parameters),
        "messages": [dict(x) for x in m.messages],
        "license": list(m.license),
        "created_at": m.created_at,
    }


def _from_json(d: Any) -> NamedModel | None:
    """A record, or None for one a hand edit broke (it is skipped, not fatal)."""
    try:
        kind = d["kind"]
        if kind not in ("pull", "copy", "create"):
            return None
        messages = tuple(
            {"role": str(x["role"]), "content": str(x["content"])} for x in d.get("messages") or ()
        )
        params = d.get("parameters") or {}
        if not isinstance(params, dict):
            return None
        return NamedModel(
            name=str(d["name"]),
            path=Path(str(d["path"])),
            base=str(d["base"]),
            kind=kind,
            system=str(d["system"]) if d.get("system") else None,
            parameters=params,
            messages=messages,
            license=tuple(str(x) for x in d.get("license") or ()),
            created_at=float(d.get("created_at") or 0.0),
        )
    except (KeyError, TypeError, ValueError):
        return None


class NamedModels:
    """name -> NamedModel, in `path` (its folder is made on the first write)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._models: dict[str, NamedModel] = {}
        self._stamp: float | None = None
        self._unreadable = False  # the file on disk could not be read: kept aside on write

    def _key(self, name: str) -> str:
        return full_name(name).casefold()  # names are matched as Ollama does: any case

    def _fresh(self) -> dict[str, NamedModel]:
        """The records, read again when the file changed (call with the lock held)."""
        try:
            stamp = self.path.stat().st_mtime_ns
        except OSError:
            self._models, self._stamp = {}, None
            return self._models
        if stamp != self._stamp:
            models: dict[str, NamedModel] = {}
            self._unreadable = False
            try:
                data = json.loads(self.path.read_text("utf-8"))
                for d in data.get("models", []) if isinstance(data, dict) else []:
                    m = _from_json(d)
                    if m is not None:
                        models[self._key(m.name)] = m
            except (OSError, ValueError) as e:
                log.warning("named models in %s unreadable, none used: %s", self.path, e)
                self._unreadable = True
            self._models, self._stamp = models, stamp
        return self._models

    def _write(self, models: dict[str, NamedModel]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self._unreadable:  # not overwritten: kept for whoever can mend it
            aside = self.path.with_name(self.path.name + ".unreadable")
            self.path.replace(aside)
            log.warning("kept the unreadable %s as %s", self.path, aside)
            self._unreadable = False
        body = {"version": VERSION, "models": [_to_json(m) for m in models.values()]}
        write_text_atomic(self.path, json.dumps(body, indent=1, ensure_ascii=False))
        self._models = models
        self._stamp = self.path.stat().st_mtime_ns

    def get(self, name: str) -> NamedModel | None:
        with self._lock:
            return self._fresh().get(self._key(name))

    def all(self) -> list[NamedModel]:
        with self._lock:
            return sorted(self._fresh().values(), key=lambda m: m.name)

    def put(self, model: NamedModel) -> None:
        with self._lock:
            models = dict(self._fresh())
            models[self._key(model.name)] = model
            self._write(models)

    def remove(self, names: list[str]) -> None:
        with self._lock:
            models = dict(self._fresh())
            for name in names:
                models.pop(self._key(name), None)
            self._write(models)


__all__ = ["FILE_NAME", "NamedModels"]
