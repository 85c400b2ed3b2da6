"""The host's keep-alive: one thread that unloads the models whose idle time ran out."""

from __future__ import annotations

import threading
from collections.abc import Callable

from engine.host.host_entry import Entry


class Reaper:
    """Started by the host's first load; sleeps on the host's condition until the next
    model is due (a change wakes it), evicts what is due, and ends when `closed()` says so
    (check it with the condition held)."""

    def __init__(
        self,
        changed: threading.Condition,
        entries: Callable[[], list[Entry]],
        evict: Callable[[Entry], None],
        clock: Callable[[], float],
        closed: Callable[[], bool],
    ) -> None:
        self._changed = changed
        self._entries = entries
        self._evict = evict
        self._clock = clock
        self._closed = closed
        self._thread = threading.Thread(target=self._run, name="candlewick-model-ttl", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._changed:
                if self._closed():
                    return
                now = self._clock()
                counting = [e for e in self._entries() if e.evictable and e.expires_at is not None]
                due = [e for e in counting if e.expires_at is not None and e.expires_at <= now]
                if not due:
                    waits = [e.expires_at - now for e in counting if e.expires_at is not None]
                    self._changed.wait(min(waits) if waits else None)
                    continue
            for e in due:
                self._evict(e)

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)


__all__ = ["Reaper"]
