"""The server's /metrics in the Prometheus text format, on prometheus-client.

Each `Metrics` has its own registry, so several servers in one process (the tests) never share
counts. Request and token counts are client-library counters and histograms, updated as requests
end; the scheduler's figures (slots, queue, KV cache) are read from its snapshot at scrape time
by a custom collector.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from engine.host.prompt_cache import PromptStateCache
from engine.host.requests import SchedulerSnapshot

_NS = "candlewick"
_TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# A sample line's value. The client library writes every value as a float ("3.0", and from
# 10^7 on "1.2e+07"); counts have always been integers here ("3"), and scripts read them with
# int(). Both are valid in the text format.
_VALUE = re.compile(rb"^([^#\n].* )(\S+)$", re.M)


def _integral(m: re.Match[bytes]) -> bytes:
    v = float(m[2])
    if math.isfinite(v) and v.is_integer() and abs(v) < 2**53:
        return m[1] + b"%d" % v
    return m[0]


# (kind, name, help, value): the scheduler's figures, read from its snapshot at scrape time.
_SNAPSHOT: tuple[tuple[str, str, str, Callable[[SchedulerSnapshot], float]], ...] = (
    ("gauge", "queue_depth", "Requests waiting for a slot.", lambda s: s.queue_depth),
    ("gauge", "slots_busy", "Slots generating or reading a prompt.", lambda s: s.busy_slots),
    ("gauge", "slots_total", "Parallel slots.", lambda s: s.n_slots),
    (
        "gauge",
        "kv_cache_used_cells",
        "KV cache cells in use (including idle slots' reusable prefixes).",
        lambda s: s.kv_used,
    ),
    ("gauge", "kv_cache_capacity_cells", "KV cache cells in all slots.", lambda s: s.kv_capacity),
    (
        "gauge",
        "kv_cache_usage_ratio",
        "Used / capacity KV cache cells.",
        lambda s: s.kv_used / s.kv_capacity if s.kv_capacity else 0.0,
    ),
    ("counter", "decode_steps_total", "Decode steps (one batch each).", lambda s: s.steps),
    (
        "counter",
        "kv_stream_copies_total",
        "KV streams copied between slots (shared prefixes, closed holes).",
        lambda s: s.kv_copies,
    ),
    (
        "counter",
        "draft_tokens_total",
        "Prompt-lookup tokens drafted and verified (speculative decoding).",
        lambda s: s.draft_tokens,
    ),
    (
        "counter",
        "draft_accepted_total",
        "Drafted tokens the model agreed with.",
        lambda s: s.draft_accepted,
    ),
)


# (kind, name, help, value): the default model's RAM prompt cache (engine.host.prompt_cache),
# read at scrape time; all 0 when its cache is off.
_CACHE: tuple[tuple[str, str, str, Callable[[PromptStateCache], float]], ...] = (
    (
        "gauge",
        "prompt_cache_bytes",
        "Bytes of saved prompt states in the RAM prompt cache.",
        lambda c: c.bytes_used,
    ),
    (
        "gauge",
        "prompt_cache_budget_bytes",
        "The RAM prompt cache's budget (--cache-ram); least recently used states go beyond it.",
        lambda c: c.max_bytes,
    ),
    ("gauge", "prompt_cache_entries", "Saved prompt states in the RAM prompt cache.", len),
    (
        "counter",
        "prompt_cache_saves_total",
        "Prompt states saved from a slot about to be reused.",
        lambda c: c.stats.saves,
    ),
    (
        "counter",
        "prompt_cache_restores_total",
        "Saved prompt states taken back into a slot for a request sharing their prefix.",
        lambda c: c.stats.restores,
    ),
    (
        "counter",
        "prompt_cache_evictions_total",
        "Saved prompt states dropped, least recently used first, to stay within the budget.",
        lambda c: c.stats.evictions,
    ),
)


def _family(kind: str, name: str, help_: str, value: float | None) -> Metric:
    cls = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
    return cls(f"{_NS}_{name}", help_, value=value)


@dataclass(frozen=True)
class ModelFigures:
    """One hosted model at scrape time."""

    name: str
    ready: bool  # loaded (False: loading)
    in_flight: int
    memory: Mapping[str, int]  # bytes per device
    snap: SchedulerSnapshot | None = None


_PER_MODEL = (
    "model_ready",
    "model_requests_in_flight",
    "model_memory_bytes",
    "model_slots_busy",
    "model_queue_depth",
    "model_loads",
)


class _SnapshotCollector:
    """Readiness, the default model's snapshot and every hosted model's figures, as
    `Metrics.render` was given them for the scrape in progress."""

    def __init__(self) -> None:
        self.snap: SchedulerSnapshot | None = None
        self.cache: PromptStateCache | None = None
        self.ready = False
        self.models: Sequence[ModelFigures] = ()
        self.loads = 0

    def describe(self) -> list[Metric]:
        # Names only, so the registry refuses a clash with the counters.
        return [
            _family("gauge", "ready", "", None),
            *(_family(k, n, h, None) for k, n, h, _ in (*_SNAPSHOT, *_CACHE)),
            *(GaugeMetricFamily(f"{_NS}_{n}", "") for n in _PER_MODEL),
        ]

    def collect(self) -> Iterator[Metric]:
        yield _family(
            "gauge", "ready", "1 when the model is loaded and serving.", 1 if self.ready else 0
        )
        snap = self.snap
        if snap is not None:  # no model: no slots to describe
            for kind, name, help_, value in _SNAPSHOT:
                yield _family(kind, name, help_, value(snap))
            cache = self.cache
            for kind, name, help_, of in _CACHE:
                yield _family(kind, name, help_, of(cache) if cache is not None else 0)
        yield from self._per_model()

    def _per_model(self) -> Iterator[Metric]:
        def gauge(name: str, help_: str, labels: Sequence[str] = ("model",)) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{_NS}_{name}", help_, labels=list(labels))

        ready = gauge("model_ready", "1 when the model is loaded, 0 while it loads.")
        flight = gauge("model_requests_in_flight", "Requests holding the model.")
        memory = gauge(
            "model_memory_bytes",
            "Memory the model takes, per device: estimated while it loads, then llama.cpp's "
            "buffers as allocated plus, on CPU, its prompt cache's saved states.",
            ("model", "device"),
        )
        busy = gauge("model_slots_busy", "The model's slots generating or reading a prompt.")
        queue = gauge("model_queue_depth", "Requests waiting for one of the model's slots.")
        for m in self.models:
            ready.add_metric([m.name], 1 if m.ready else 0)
            flight.add_metric([m.name], m.in_flight)
            for dev, n in sorted(m.memory.items()):
                memory.add_metric([m.name, dev], n)
            if m.snap is not None:
                busy.add_metric([m.name], m.snap.busy_slots)
                queue.add_metric([m.name], m.snap.queue_depth)
        yield from (ready, flight, memory, busy, queue)
        yield CounterMetricFamily(
            f"{_NS}_model_loads", "Models loaded on demand.", value=self.loads
        )


class _WithoutCreated:
    """The registry less the `_created` series the client library adds to every counter and
    histogram (their start times): the exposition never had them, and Prometheus needs none.
    Per registry, where `disable_created_metrics()` would change the whole process."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for m in self._registry.collect():  # fresh Metric objects on every collect
            m.samples = [s for s in m.samples if not s.name.endswith("_created")]
            yield m


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._requests = Counter(
            "requests",
            "HTTP requests by route and status code.",
            ("route", "status"),
            namespace=_NS,
            registry=r,
        )
        self._prompt_tokens = Counter(
            "prompt_tokens", "Prompt tokens received.", namespace=_NS, registry=r
        )
        self._cached_tokens = Counter(
            "prompt_tokens_cached",
            "Prompt tokens reused from a slot's KV cache.",
            namespace=_NS,
            registry=r,
        )
        self._completion_tokens = Counter(
            "completion_tokens", "Tokens generated.", namespace=_NS, registry=r
        )
        self._rejected = Counter(
            "requests_rejected",
            "Requests refused with 429 (queue full).",
            namespace=_NS,
            registry=r,
        )
        self._ttft = Histogram(
            "time_to_first_token_seconds",
            "Seconds from request arrival to the first generated text.",
            namespace=_NS,
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self._latency = Histogram(
            "request_duration_seconds",
            "Seconds per generation request.",
            namespace=_NS,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._snapshot = _SnapshotCollector()
        r.register(self._snapshot)
        self._exposed = _WithoutCreated(r)
        # The collector reads the snapshot of the scrape in progress: one scrape at a time.
        self._scrape = threading.Lock()

    def request_done(self, route: str, status: int) -> None:
        self._requests.labels(route=route, status=str(status)).inc()
        if status == 429:
            self._rejected.inc()

    def generation_done(
        self, prompt: int, cached: int, completion: int, ttft_s: float, total_s: float
    ) -> None:
        self._prompt_tokens.inc(prompt)
        self._cached_tokens.inc(cached)
        self._completion_tokens.inc(completion)
        self._ttft.observe(ttft_s)
        self._latency.observe(total_s)

    def render(
        self,
        snap: SchedulerSnapshot | None,
        ready: bool,
        models: Sequence[ModelFigures] = (),
        loads: int = 0,
        cache: PromptStateCache | None = None,
    ) -> str:
        """The text exposition (format 0.0.4) with `snap`'s figures and `cache`'s (the
        default model's loop and RAM prompt cache; none without a model) and each hosted
        model's."""
        c = self._snapshot
        with self._scrape:
            c.snap, c.cache, c.ready, c.models, c.loads = snap, cache, ready, models, loads
            try:
                text = generate_latest(self._exposed)
            finally:
                c.snap, c.cache, c.ready, c.models, c.loads = None, None, False, (), 0
        return _VALUE.sub(_integral, text).decode("utf-8")
