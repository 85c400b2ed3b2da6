"""A bounded RAM cache of KV-cache snapshots, keyed by the tokens they hold.

When a slot is about to be overwritten (the user switched conversations, or another client's
request took the slot of an API client's prompt), saving the sequence state first (llama.cpp's
`llama_state_seq_get_data`) means that coming back restores it with a memory copy instead of
re-processing the whole history. Entries are found by longest common token prefix and evicted
least-recently-used once the byte budget is exceeded.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


def common_prefix(a: list[int] | tuple[int, ...], b: list[int] | tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    i = 0
    # Compare in slices first: long shared histories are the common case.
    step = 256
    while i + step <= n and a[i : i + step] == b[i : i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class CacheStats:
    saves: int = 0
    restores: int = 0
    evictions: int = 0


class PromptStateCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], bytes] = OrderedDict()
        # How many leading tokens of each snapshot were evaluated the canonical way
        # (engine.host.batch_plan): a restored prefix is reused for an exact prompt only that far.
        self._exact: dict[tuple[int, ...], int] = {}
        self._bytes = 0
        self.stats = CacheStats()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes_used(self) -> int:
        return self._bytes

    def best(self, tokens: list[int]) -> tuple[tuple[int, ...], int] | None:
        """The entry sharing the longest prefix with `tokens`, and that prefix's length."""
        best: tuple[tuple[int, ...], int] | None = None
        for key in self._entries:
            n = common_prefix(key, tokens)
            if n and (best is None or n > best[1]):
                best = (key, n)
        return best

    def get(self, key: tuple[int, ...]) -> bytes | None:
        state = self._entries.get(key)
        if state is not None:
            self._entries.move_to_end(key)
            self.stats.restores += 1
        return state

    def exact_prefix(self, key: tuple[int, ...]) -> int:
        return self._exact.get(key, 0)

    def contains(self, key: tuple[int, ...]) -> bool:
        return key in self._entries

    def clear(self) -> None:
        self._entries.clear()
        self._exact.clear()
        self._bytes = 0

    def put(self, key: tuple[int, ...], state: bytes, exact: int = 0) -> None:
        if len(state) > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= len(old)
        # A snapshot that extends an older one makes the older one redundant.
        for k in [k for k in self._entries if len(k) < len(key) and key[: len(k)] == k]:
            self._bytes -= len(self._entries.pop(k))
            self._exact.pop(k, None)
        self._entries[key] = state
        self._exact[key] = exact
        self._bytes += len(state)
        self.stats.saves += 1
        while self._bytes > self.max_bytes and self._entries:
            gone, evicted = self._entries.popitem(last=False)
            self._exact.pop(gone, None)
            self._bytes -= len(evicted)
            self.stats.evictions += 1
