"""Prometheus text-format metrics, without a client library (a few counters and histograms)."""

from __future__ import annotations

import threading
from collections import defaultdict

from engine.host.scheduler import SchedulerSnapshot

_TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total = 0
        self.sum = 0.0

    def observe(self, v: float) -> None:
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1
        self.total += 1
        self.sum += v

    def render(self, name: str) -> list[str]:
        out = [f'{name}_bucket{{le="{b}"}} {c}' for b, c in zip(self.buckets, self.counts,
                                                               strict=True)]
        out.append(f'{name}_bucket{{le="+Inf"}} {self.total}')
        out.append(f"{name}_sum {self.sum:.6f}")
        out.append(f"{name}_count {self.total}")
        return out


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.rejected = 0
        self.ttft = _Histogram(_TTFT_BUCKETS)
        self.latency = _Histogram(_LATENCY_BUCKETS)

    def request_done(self, route: str, status: int) -> None:
        with self._lock:
            self.requests[(route, status)] += 1
            if status == 429:
                self.rejected += 1

    def generation_done(self, prompt: int, cached: int, completion: int, ttft_s: float,
                        total_s: float) -> None:
        with self._lock:
            self.prompt_tokens += prompt
            self.cached_tokens += cached
            self.completion_tokens += completion
            self.ttft.observe(ttft_s)
            self.latency.observe(total_s)

    def render(self, snap: SchedulerSnapshot | None, ready: bool) -> str:
        p = "candlewick_"
        lines: list[str] = []

        def head(name: str, kind: str, help_: str) -> None:
            lines.append(f"# HELP {p}{name} {help_}")
            lines.append(f"# TYPE {p}{name} {kind}")

        with self._lock:
            head("requests_total", "counter", "HTTP requests by route and status code.")
            for (route, status), n in sorted(self.requests.items()):
                lines.append(f'{p}requests_total{{route="{route}",status="{status}"}} {n}')
            head("prompt_tokens_total", "counter", "Prompt tokens received.")
            lines.append(f"{p}prompt_tokens_total {self.prompt_tokens}")
            head("prompt_tokens_cached_total", "counter",
                 "Prompt tokens reused from a slot's KV cache.")
            lines.append(f"{p}prompt_tokens_cached_total {self.cached_tokens}")
            head("completion_tokens_total", "counter", "Tokens generated.")
            lines.append(f"{p}completion_tokens_total {self.completion_tokens}")
            head("requests_rejected_total", "counter", "Requests refused with 429 (queue full).")
            lines.append(f"{p}requests_rejected_total {self.rejected}")
            head("time_to_first_token_seconds", "histogram",
                 "Seconds from request arrival to the first generated text.")
            lines.extend(p + x for x in self.ttft.render("time_to_first_token_seconds"))
            head("request_duration_seconds", "histogram", "Seconds per generation request.")
            lines.extend(p + x for x in self.latency.render("request_duration_seconds"))
        head("ready", "gauge", "1 when the model is loaded and serving.")
        lines.append(f"{p}ready {1 if ready else 0}")
        if snap is not None:
            head("queue_depth", "gauge", "Requests waiting for a slot.")
            lines.append(f"{p}queue_depth {snap.queue_depth}")
            head("slots_busy", "gauge", "Slots generating or reading a prompt.")
            lines.append(f"{p}slots_busy {snap.busy_slots}")
            head("slots_total", "gauge", "Parallel slots.")
            lines.append(f"{p}slots_total {snap.n_slots}")
            head("kv_cache_used_cells", "gauge",
                 "KV cache cells in use (including idle slots' reusable prefixes).")
            lines.append(f"{p}kv_cache_used_cells {snap.kv_used}")
            head("kv_cache_capacity_cells", "gauge", "KV cache cells in all slots.")
            lines.append(f"{p}kv_cache_capacity_cells {snap.kv_capacity}")
            head("kv_cache_usage_ratio", "gauge", "Used / capacity KV cache cells.")
            ratio = snap.kv_used / snap.kv_capacity if snap.kv_capacity else 0.0
            lines.append(f"{p}kv_cache_usage_ratio {ratio:.6f}")
            head("decode_steps_total", "counter", "Batched llama_decode calls.")
            lines.append(f"{p}decode_steps_total {snap.steps}")
            head("kv_stream_copies_total", "counter",
                 "KV streams copied between slots (shared prefixes, closed holes).")
            lines.append(f"{p}kv_stream_copies_total {snap.kv_copies}")
            head("draft_tokens_total", "counter",
                 "Prompt-lookup tokens drafted and verified (speculative decoding).")
            lines.append(f"{p}draft_tokens_total {snap.draft_tokens}")
            head("draft_accepted_total", "counter", "Drafted tokens the model agreed with.")
            lines.append(f"{p}draft_accepted_total {snap.draft_accepted}")
        return "\n".join(lines) + "\n"
