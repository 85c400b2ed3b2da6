"""Benchmark metrics computed from recorded request traces (timestamps + token counts).

Every number the benchmark reports comes from here, so the same arithmetic serves the embedded
engine and any HTTP server, and unit tests can check it against hand-made traces.

Definitions (all client-side, as a user of the runtime experiences it):

- TTFT: request sent -> first content token received. Under load it includes queueing.
- prompt processing tokens/s: prompt tokens / TTFT of that request. Includes queueing and the
  network, so it is the *effective* rate; the embedded engine also records llama.cpp's own.
- generation tokens/s per request: (completion tokens - 1) / (last token - first token); the
  first token belongs to the prompt phase.
- end-to-end latency: request sent -> last byte of the answer.
- total throughput: completion tokens of all successful requests / wall time of the level
  (first request sent -> last request finished).
- failure rate: (errors + timeouts) / requests.
- max concurrent requests: the largest concurrency whose TTFT p95 meets the objective with no
  failures.

With images (a workload whose prompts carry them), each request also records how many it
sent and, from the embedded engine, what the projector did: the media tokens its images
became and the time spent encoding them (`media_encode_ms`, part of TTFT; 0 chunks encoded
when the KV cache already held them). A level reports the encode time's p50/p95 and the
media rate: media tokens / encode time of each request that encoded its images, p50. A
text workload's traces and levels carry none of these keys.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RequestTrace:
    """What one request did. Times are seconds on one monotonic clock (`time.perf_counter`)."""

    index: int
    t_start: float
    t_end: float
    t_first: float | None = None  # first content token; None when none arrived
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None  # None = success
    timed_out: bool = False
    token_source: str = "usage"  # usage | tokenizer | engine | estimate
    finish_reason: str | None = None
    engine_prompt_tps: float | None = None  # llama.cpp's own counters, embedded engine only
    engine_gen_tps: float | None = None
    # Images (MEDIA_TRACE_FIELDS): sent, and from the engine's stats (None: not reported).
    images: int = 0
    media_tokens: int | None = None
    media_encoded: int | None = None  # chunks the projector encoded for this request
    media_encode_ms: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out

    @property
    def ttft(self) -> float | None:
        return None if self.t_first is None else self.t_first - self.t_start

    @property
    def latency(self) -> float:
        return self.t_end - self.t_start

    @property
    def prompt_tps(self) -> float | None:
        ttft = self.ttft
        if ttft is None or ttft <= 0 or self.prompt_tokens <= 0:
            return None
        return self.prompt_tokens / ttft

    @property
    def gen_tps(self) -> float | None:
        if self.t_first is None or self.completion_tokens < 2:
            return None
        span = self.t_end - self.t_first
        if span <= 0:
            return None
        return (self.completion_tokens - 1) / span

    @property
    def media_tps(self) -> float | None:
        """Media tokens per second of encoding (None: nothing was encoded)."""
        if not self.media_encoded or not self.media_tokens or not self.media_encode_ms:
            return None
        return self.media_tokens / (self.media_encode_ms / 1000)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ttft"] = self.ttft
        d["latency"] = self.latency
        if self.images:
            d["media_tps"] = self.media_tps
        else:  # a text request: its JSON as before images were measured
            for k in MEDIA_TRACE_FIELDS:
                del d[k]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestTrace:
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in names})


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation between ranks (numpy's default)."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError("percentile must be between 0 and 100")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = math.ceil(pos)
    if lo == hi:
        return xs[lo]
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _median(values: Iterable[float | None]) -> float | None:
    return percentile([v for v in values if v is not None], 50)


def _mean(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


@dataclass
class LevelMetrics:
    """Everything measured at one concurrency level."""

    concurrency: int
    requests: int
    succeeded: int
    errors: int
    timeouts: int
    failure_rate: float
    ttft_p50: float | None
    ttft_p95: float | None
    latency_p50: float | None
    latency_p95: float | None
    prompt_tps_p50: float | None
    gen_tps_p50: float | None
    gen_tps_mean: float | None
    total_throughput_tps: float  # completion tokens per second, all requests together
    requests_per_s: float
    wall_s: float
    prompt_tokens: int
    completion_tokens: int
    meets_slo: bool | None = None  # None when no objective was given
    peak_ram_bytes: int | None = None
    peak_vram_bytes: int | None = None
    engine_prompt_tps_p50: float | None = None  # llama.cpp's own counters (embedded only)
    engine_gen_tps_p50: float | None = None
    error_samples: list[str] = field(default_factory=list)
    # Images (MEDIA_LEVEL_FIELDS), over the successful requests; None: not reported.
    images: int = 0  # images sent
    media_tokens: int | None = None  # all together
    media_encode_ms_p50: float | None = None  # per request that encoded its images
    media_encode_ms_p95: float | None = None
    media_tps_p50: float | None = None  # media tokens / encode time, per request

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not self.images:  # a text level: its JSON as before images were measured
            for k in MEDIA_LEVEL_FIELDS:
                del d[k]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LevelMetrics:
        names = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in names})


MEDIA_TRACE_FIELDS = ("images", "media_tokens", "media_encoded", "media_encode_ms")
MEDIA_LEVEL_FIELDS = (
    "images",
    "media_tokens",
    "media_encode_ms_p50",
    "media_encode_ms_p95",
    "media_tps_p50",
)


def _media(lv: LevelMetrics, ok: Sequence[RequestTrace]) -> None:
    """The level's image figures from its successful requests."""
    lv.images = sum(t.images for t in ok)
    with_media = [t for t in ok if t.images]
    counted = [t.media_tokens for t in with_media if t.media_tokens is not None]
    lv.media_tokens = sum(counted) if counted else None
    encodes = [t.media_encode_ms for t in with_media if t.media_encoded and t.media_encode_ms]
    lv.media_encode_ms_p50 = percentile(encodes, 50)
    lv.media_encode_ms_p95 = percentile(encodes, 95)
    lv.media_tps_p50 = _median(t.media_tps for t in with_media)


def level_metrics(
    concurrency: int, traces: Sequence[RequestTrace], *, slo_ttft_s: float | None = None
) -> LevelMetrics:
    ok = [t for t in traces if t.ok]
    timeouts = sum(1 for t in traces if t.timed_out)
    errors = sum(1 for t in traces if not t.ok and not t.timed_out)
    n = len(traces)
    ttfts = [t.ttft for t in ok if t.ttft is not None]
    lats = [t.latency for t in ok]
    wall = max(t.t_end for t in traces) - min(t.t_start for t in traces) if traces else 0.0
    completion = sum(t.completion_tokens for t in ok)
    failure_rate = (errors + timeouts) / n if n else 0.0
    ttft_p95 = percentile(ttfts, 95)
    meets: bool | None = None
    if slo_ttft_s is not None:
        meets = bool(ok) and failure_rate == 0 and ttft_p95 is not None and ttft_p95 <= slo_ttft_s
    samples: list[str] = []
    for t in traces:
        if not t.ok:
            msg = "timed out" if t.timed_out else str(t.error)
            if msg not in samples:
                samples.append(msg)
    lv = LevelMetrics(
        concurrency=concurrency,
        requests=n,
        succeeded=len(ok),
        errors=errors,
        timeouts=timeouts,
        failure_rate=failure_rate,
        ttft_p50=percentile(ttfts, 50),
        ttft_p95=ttft_p95,
        latency_p50=percentile(lats, 50),
        latency_p95=percentile(lats, 95),
        prompt_tps_p50=_median(t.prompt_tps for t in ok),
        gen_tps_p50=_median(t.gen_tps for t in ok),
        gen_tps_mean=_mean(t.gen_tps for t in ok),
        total_throughput_tps=completion / wall if wall > 0 else 0.0,
        requests_per_s=len(ok) / wall if wall > 0 else 0.0,
        wall_s=wall,
        prompt_tokens=sum(t.prompt_tokens for t in ok),
        completion_tokens=completion,
        meets_slo=meets,
        error_samples=samples[:5],
    )
    _media(lv, ok)
    return lv


def max_concurrency_meeting_slo(levels: Sequence[LevelMetrics]) -> int | None:
    """The largest concurrency whose level met the TTFT objective (None: none did, or no
    objective). Levels above a failing one still count: a server may recover as batching
    amortises, and the user asked about each level."""
    good = [lv.concurrency for lv in levels if lv.meets_slo]
    return max(good) if good else None


@dataclass(frozen=True)
class Roofline:
    """The decode speed limit set by memory bandwidth: every weight is read once per token."""

    bandwidth_bytes_per_s: float
    bytes_per_token: int
    achieved_tps: float | None  # single-stream generation tokens/s measured

    @property
    def limit_tps(self) -> float:
        return self.bandwidth_bytes_per_s / self.bytes_per_token if self.bytes_per_token else 0.0

    @property
    def achieved_pct(self) -> float | None:
        if self.achieved_tps is None or self.limit_tps <= 0:
            return None
        return 100.0 * self.achieved_tps / self.limit_tps

    def to_dict(self) -> dict[str, Any]:
        return {
            "bandwidth_gb_s": self.bandwidth_bytes_per_s / 1e9,
            "bytes_per_token": self.bytes_per_token,
            "limit_tps": self.limit_tps,
            "achieved_tps": self.achieved_tps,
            "achieved_pct": self.achieved_pct,
        }
