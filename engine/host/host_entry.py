"""One model in the host's registry: its names, who holds it, how long it stays, what it
takes, and what clients keep about it (`Attachment`); `HostedModel` is how clients see it;
`Listeners` hear models come and go."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from engine.errors import EngineError
from engine.host.runtime import Model


class Attachment(Protocol):
    """What a client keeps about one loaded model (the server's handle on it), kept on the
    host's entry so the host stays the one registry: closed when the model goes."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class HostedModel:
    """One model as the host sees it now (for `/api/ps`, `/health`, the Loaded models view)."""

    name: str
    path: Path | None
    state: str  # loading | ready
    owner: str | None  # the client that added it and frees it; None: the host loaded it
    pinned: bool
    in_flight: int
    memory: Mapping[str, int]  # bytes per device: estimated while loading, then actual
    keep_s: float | None
    expires_in_s: float | None  # idle time left before it is unloaded; None: not counting
    loaded_at: float  # time.time() when it finished loading (0 while loading)
    last_used_s: float  # seconds since its last request ended (or it was loaded)
    leased_by: str | None = None  # who holds its loop's slots now (the Local server, a benchmark)


@dataclass(eq=False)
class Entry:
    name: str
    path: Path | None
    aliases: tuple[str, ...] = ()
    title: str = ""
    model: Model | None = None
    owner: str | None = None
    pinned: bool = False
    keep_s: float | None = None  # how long it stays once idle; None: kept
    in_flight: int = 0
    served: int = 0  # leases taken since it was added or loaded (requests it answered)
    last_used: float = 0.0
    expires_at: float | None = None
    loaded_at: float = 0.0
    error: BaseException | None = None
    memory: dict[str, int] = field(default_factory=dict)
    attached: dict[object, Attachment] = field(default_factory=dict)  # by client key

    def answers_to(self, name: str) -> bool:
        return matches(name, self.name, self.aliases, self.path)

    @property
    def evictable(self) -> bool:
        return (
            self.owner is None
            and self.model is not None
            and self.in_flight == 0
            and not self.pinned
        )

    def wait_loaded(
        self, changed: threading.Condition, deadline: float | None, clock: Callable[[], float]
    ) -> None:
        """Until its load ends (`changed`: the host's condition): its error is raised, and
        EngineError when `deadline` (on `clock`) passes first."""
        with changed:
            while self.model is None and self.error is None:
                left = None if deadline is None else deadline - clock()
                if left is not None and left <= 0:
                    raise EngineError(f"{self.title} is still loading; retry shortly")
                changed.wait(left if left is not None else 1.0)
            if self.error is not None:
                raise self.error

    def idle_from(self, now: float) -> None:
        """No request holds it from `now` on: its keep-alive counts from there."""
        self.last_used = now
        self.expires_at = None if self.keep_s is None else now + self.keep_s

    def view(self, now: float) -> HostedModel:
        """The entry as clients see it at `now` (the host's clock)."""
        counting = self.expires_at is not None and self.evictable
        return HostedModel(
            self.name,
            self.path,
            "ready" if self.model is not None else "loading",
            self.owner,
            self.pinned,
            self.in_flight,
            dict(self.memory),
            self.keep_s,
            max(self.expires_at - now, 0) if self.expires_at is not None and counting else None,
            self.loaded_at,
            now - self.last_used if self.model is not None else 0.0,
            _leased_by(self.model),
        )

    def close_attached(self) -> None:
        """The model has left the host (listeners told): what clients kept goes with it."""
        gone, self.attached = list(self.attached.values()), {}
        for a in gone:
            a.close()


def _leased_by(model: Model | None) -> str | None:
    sched = getattr(model, "scheduler", None)  # a model whose loop has ended has none
    return sched.leased_by if sched is not None else None


Listener = Callable[[str, Model | None], None]


class Listeners:
    """Who hears that a model came into the host (`fn(name, model)`) or is leaving it
    (`fn(name, None)`, before it is freed), on the thread that changed it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fns: list[Listener] = []

    def subscribe(self, fn: Listener) -> Callable[[], None]:
        """Returns the call that stops it."""
        with self._lock:
            self._fns.append(fn)

        def unsubscribe() -> None:
            with self._lock, contextlib.suppress(ValueError):
                self._fns.remove(fn)

        return unsubscribe

    def tell(self, name: str, model: Model | None) -> None:
        with self._lock:
            fns = list(self._fns)
        for fn in fns:
            fn(name, model)


def matches(name: str, own: str, aliases: Sequence[str], path: Path | None) -> bool:
    """A model answers to its id, its aliases and its file name (with or without .gguf),
    in any case: clients are configured by hand."""
    wanted = name.casefold()
    names = [own, *aliases]
    if path is not None:
        names += [path.name, path.stem]
    return any(n.casefold() == wanted for n in names)


__all__ = ["Attachment", "Entry", "HostedModel", "Listener", "Listeners", "matches"]
