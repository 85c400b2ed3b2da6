"""A bounded log of answered requests, for a viewer such as the desktop app's server panel.

The HTTP layer appends one `RequestRecord` per answered request (on the event loop thread);
a viewer takes the new ones with `drain()` from any thread. Records hold the method and path,
never headers, so the API key cannot end up in the log; a key typed into a URL is masked too.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections import deque
from dataclasses import dataclass, field


@dataclass
class RequestRecord:
    method: str
    path: str
    client: str = ""
    status: int = 0
    prompt_tokens: int | None = None  # None: the request generated nothing
    completion_tokens: int | None = None
    latency_s: float = 0.0
    at: float = field(default_factory=time.time)  # wall-clock arrival time

    def add_tokens(self, prompt: int, completion: int) -> None:
        self.prompt_tokens = (self.prompt_tokens or 0) + prompt
        self.completion_tokens = (self.completion_tokens or 0) + completion


# The record of the request being handled: set by the middleware, read by the generation so
# that token counts land in the right row (child tasks of a streamed answer share the object).
current_record: contextvars.ContextVar[RequestRecord | None] = contextvars.ContextVar(
    "candlewick_request_record", default=None
)


class RequestLog:
    """Thread-safe, keeps the last `maxlen` records that nobody has drained yet."""

    def __init__(self, maxlen: int = 500, secret: str | None = None) -> None:
        self._lock = threading.Lock()
        self._new: deque[RequestRecord] = deque(maxlen=maxlen)
        self._secret = secret
        self.total = 0  # records ever appended (drained or dropped included)

    def append(self, record: RequestRecord) -> None:
        if self._secret and self._secret in record.path:
            record.path = record.path.replace(self._secret, "***")
        with self._lock:
            self._new.append(record)
            self.total += 1

    def drain(self) -> list[RequestRecord]:
        with self._lock:
            out = list(self._new)
            self._new.clear()
        return out
