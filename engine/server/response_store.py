"""The recent responses that `previous_response_id` can continue from: a bounded LRU in memory.

The server is otherwise stateless: what falls out of this store (too old, too big, a restart)
is a clear 400 saying so, and the client sends the whole conversation instead. Each entry is
the conversation up to and including that response's output, as chat messages (without the
request's `instructions`, which OpenAI does not carry over either).
"""

from __future__ import annotations

import copy
import json
import threading
from collections import OrderedDict
from typing import Any

MAX_RESPONSES = 256
MAX_CHARS = 32 * 2**20  # all entries together, as JSON text: a bound on the memory held


class ResponseStore:
    def __init__(self, max_responses: int = MAX_RESPONSES, max_chars: int = MAX_CHARS) -> None:
        self.max_responses = max_responses
        self.max_chars = max_chars
        self._items: OrderedDict[str, tuple[list[dict[str, Any]], int]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()  # the desktop app and the tests may share one store

    def put(self, response_id: str, conversation: list[dict[str, Any]]) -> None:
        size = len(json.dumps(conversation, ensure_ascii=False))
        with self._lock:
            old = self._items.pop(response_id, None)
            if old is not None:
                self._chars -= old[1]
            if size > self.max_chars:
                return  # larger than the whole store: never kept
            self._items[response_id] = (conversation, size)
            self._chars += size
            while len(self._items) > self.max_responses or self._chars > self.max_chars:
                _, (_, n) = self._items.popitem(last=False)
                self._chars -= n

    def get(self, response_id: str) -> list[dict[str, Any]] | None:
        """The conversation after that response (a copy to extend), or None if not kept."""
        with self._lock:
            item = self._items.get(response_id)
            if item is None:
                return None
            self._items.move_to_end(response_id)
            return copy.deepcopy(item[0])

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
