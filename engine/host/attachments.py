"""What clients keep about the host's loaded models (the server's handle on each), kept on
the host's entries: the host stays the one registry, and what a client kept about a model
is closed when the model leaves the host (`Entry.close_attached`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar, cast

from engine.host.host_entry import Attachment, Entry
from engine.host.runtime import Model

A = TypeVar("A", bound=Attachment)


class Attachments:
    """`lock`: the host's; `entries`: its entries (read with the lock held); `loaded`: the
    loaded entry of a name, or ModelNotLoaded (with the lock held)."""

    def __init__(
        self,
        lock: threading.Lock,
        entries: Callable[[], list[Entry]],
        loaded: Callable[[str], Entry],
    ) -> None:
        self._lock = lock
        self._entries = entries
        self._loaded = loaded

    def get(self, name: str, key: object, make: Callable[[str, Model], A]) -> A:
        """What the client `key` keeps about the loaded model `name`, made by `make(name,
        model)` the first time (off the lock: it may be slow). ModelNotLoaded when it is
        not loaded."""
        with self._lock:
            e = self._loaded(name)
            got, model = e.attached.get(key), e.model
        if got is not None:
            return cast(A, got)
        assert model is not None
        made = make(e.name, model)
        with self._lock:
            here = e in self._entries() and e.model is model
            got = e.attached.setdefault(key, made) if here else None
        if got is not made:
            made.close()  # another caller made it first, or the model went meanwhile
        if got is None:  # the model went: ModelNotLoaded, or the one loaded since
            return self.get(name, key, make)
        return cast(A, got)

    def set(self, name: str, key: object, value: Attachment) -> Attachment | None:
        """Set what `key` keeps about the loaded model `name`; returns what it replaced (the
        caller closes that)."""
        with self._lock:
            e = self._loaded(name)
            old, e.attached[key] = e.attached.get(key), value
        return old

    def of(self, key: object) -> list[tuple[str, Attachment]]:
        """What `key` keeps, by the loaded models' names."""
        with self._lock:
            return [(e.name, e.attached[key]) for e in self._entries() if key in e.attached]

    def drop(self, key: object) -> list[Attachment]:
        """Forget what `key` keeps about every model; the caller closes what is returned."""
        with self._lock:
            return [e.attached.pop(key) for e in self._entries() if key in e.attached]


__all__ = ["Attachments"]
