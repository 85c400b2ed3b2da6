"""A benchmark's result: what `run_benchmark` returns, `--out` and the Benchmark window's Save
JSON write, and `bench compare` reads back.

The parts the program reads are typed: the run's settings, the workload, each level's metrics,
each request's trace and the roofline. The target's and the machine's descriptions stay the
open dicts each target (`Target.describe`) and `engine.bench.hw.machine_context` write: their
keys differ by target kind. `to_dict` is the JSON (schema `candlewick-bench/1`), `from_dict`
reads it back.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from engine.bench.metrics import LevelMetrics, RequestTrace, Roofline
from engine.errors import EngineError

SCHEMA = "candlewick-bench/1"


class BenchError(EngineError):
    """The benchmark cannot run as asked, or a file is not a result; `str()` is one line for
    the user."""


def _known(cls: type, data: Any) -> dict[str, Any]:
    """The keys of `data` that are fields of the dataclass `cls` (a newer file's extra keys
    are left out)."""
    if not isinstance(data, dict):
        raise TypeError(f"expected an object for {cls.__name__}")
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass
class WorkloadInfo:
    name: str = ""
    source: str = ""
    prompts: int = 0  # how many prompts the workload has
    images: int = 0  # how many images its prompts carry (0: text only, and left out of JSON)


@dataclass
class RunSettings:
    """The settings a run used, as the result records them."""

    concurrency: list[int] = field(default_factory=list)
    requests_per_level: int = 0
    max_tokens_cap: int | None = None
    slo_ttft_s: float | None = None
    warmup: int = 0
    unique_prompts: bool = True


@dataclass(frozen=True)
class RooflineReport:
    """`metrics.Roofline` as recorded: its figures, and a note on what they assume."""

    bandwidth_gb_s: float
    bytes_per_token: int
    limit_tps: float
    achieved_tps: float | None
    achieved_pct: float | None
    note: str = ""

    @classmethod
    def of(cls, roofline: Roofline, note: str) -> RooflineReport:
        return cls(**roofline.to_dict(), note=note)


@dataclass(frozen=True)
class RetrievalReport:
    """The `rag` workload on a collection: the search done before each prompt is sent,
    timed apart (it is not in TTFT), and what its passages added to the prompts."""

    collection: str
    questions: int
    k: int  # passages searched for
    ms_p50: float  # milliseconds per question: embedding it and searching
    ms_p95: float
    ms_max: float
    mean_passages: float  # passages that fit the budget, per prompt
    mean_tokens: float  # tokens the passages added, per prompt
    budget: int = 0  # the most tokens a prompt's passages could take


def _workload_dict(w: WorkloadInfo) -> dict[str, Any]:
    d = asdict(w)
    if not w.images:  # a text workload: its JSON as before images were measured
        del d["images"]
    return d


@dataclass
class BenchResult:
    """One run: with the hardware and software context, so two results from different
    machines or runtimes can be compared."""

    created: str = ""  # ISO 8601, UTC
    finished: str = ""
    cancelled: bool = False
    command: list[str] | None = None  # the command line, when run from one
    target: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    workload: WorkloadInfo = field(default_factory=WorkloadInfo)
    config: RunSettings = field(default_factory=RunSettings)
    levels: list[LevelMetrics] = field(default_factory=list)
    max_concurrency_meeting_slo: int | None = None
    roofline: RooflineReport | None = None
    traces: dict[int, list[RequestTrace]] = field(default_factory=dict)  # by concurrency
    retrieval: RetrievalReport | None = None  # a `rag` workload on a collection

    @property
    def has_media(self) -> bool:
        """Whether the workload sent images (the report then shows their figures)."""
        return bool(self.workload.images) or any(lv.images for lv in self.levels)

    def level_cancelled(self, concurrency: int) -> bool:
        """Whether a cancel cut the level short (one of its requests was cancelled)."""
        return any(t.error == "cancelled" for t in self.traces.get(concurrency, []))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "created": self.created,
            "finished": self.finished,
            "cancelled": self.cancelled,
            "command": self.command,
            "target": dict(self.target),
            "machine": dict(self.machine),
            "workload": _workload_dict(self.workload),
            "config": asdict(self.config),
            "levels": [lv.to_dict() for lv in self.levels],
            "max_concurrency_meeting_slo": self.max_concurrency_meeting_slo,
            "roofline": asdict(self.roofline) if self.roofline is not None else None,
            "traces": {str(c): [t.to_dict() for t in ts] for c, ts in self.traces.items()},
        }
        if self.retrieval is not None:  # left out otherwise: older files read back unchanged
            out["retrieval"] = asdict(self.retrieval)
        return out

    def to_json(self) -> str:
        """The file `--out` and Save JSON write."""
        return json.dumps(self.to_dict(), indent=1) + "\n"

    @classmethod
    def from_dict(cls, data: Any) -> BenchResult:
        """A result read back from its JSON; `BenchError` when it is not one."""
        if (
            not isinstance(data, dict)
            or data.get("schema") != SCHEMA
            or not isinstance(data.get("levels"), list)
        ):
            raise BenchError("not a Candlewick benchmark result")
        try:
            rf = data.get("roofline")
            rt = data.get("retrieval")  # absent in files from before it was measured
            return cls(
                created=str(data.get("created") or ""),
                finished=str(data.get("finished") or ""),
                cancelled=bool(data.get("cancelled")),
                command=data.get("command"),
                target=dict(data.get("target") or {}),
                machine=dict(data.get("machine") or {}),
                workload=WorkloadInfo(**_known(WorkloadInfo, data.get("workload") or {})),
                config=RunSettings(**_known(RunSettings, data.get("config") or {})),
                levels=[LevelMetrics.from_dict(lv) for lv in data["levels"]],
                max_concurrency_meeting_slo=data.get("max_concurrency_meeting_slo"),
                roofline=RooflineReport(**_known(RooflineReport, rf)) if rf else None,
                traces={
                    int(c): [RequestTrace.from_dict(t) for t in ts]
                    for c, ts in (data.get("traces") or {}).items()
                },
                retrieval=RetrievalReport(**_known(RetrievalReport, rt)) if rt else None,
            )
        except (TypeError, ValueError, AttributeError) as e:
            raise BenchError(f"not a Candlewick benchmark result ({e})") from None


__all__ = [
    "SCHEMA",
    "BenchError",
    "BenchResult",
    "RetrievalReport",
    "RooflineReport",
    "RunSettings",
    "WorkloadInfo",
]
