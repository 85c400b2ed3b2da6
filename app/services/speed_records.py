"""Predicted decode speed of a model file on this machine, and the speed measured once it runs.

`SpeedService` predicts from a GGUF header (`engine.bench.speed_model`, with this machine's
figures measured once by `engine.bench.speed_probe` and kept in the data folder) and keeps,
per model file, what was predicted and what the chat measured (`SpeedRecords`, a JSON file).
A file is known by its name and size, so the prediction made for a Hub file before it was
downloaded meets the speed measured after.

The measurements are slow the first time (a few seconds of probe models decoding): callers
run `predict` off the GUI thread.
"""

from __future__ import annotations

import json
import statistics
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.services.atomic_write import write_text_atomic
from engine.bench.speed_model import DecodeCost, SpeedPrediction, predict
from engine.bench.speed_probe import ProbeSettings, SpeedProfile
from engine.memory import cpu_kernels
from engine.model.gguf import GGUFFile, read_gguf

# Measured speeds kept per file: the median of the latest replies.
KEEP_SAMPLES = 9
# A reply shorter than this says more about its prompt than about decoding.
MIN_TOKENS = 16


def file_key(name: str, size: int) -> str:
    """A model file's key: its file name and size (a Hub variant's and its download's)."""
    return f"{Path(name).name}|{int(size)}"


@dataclass(frozen=True)
class SpeedView:
    """What the app shows for a model: predicted, and measured when known."""

    predicted_tps: float | None
    basis: str
    measured_tps: float | None = None
    measured_n: int = 0
    measured_source: str = ""

    def text(self) -> str:
        """A badge: "~45 tok/s", with the measured figure beside once known."""
        parts = []
        if self.predicted_tps is not None:
            parts.append(f"~{self.predicted_tps:.0f} tok/s")
        if self.measured_tps is not None:
            parts.append(f"measured {self.measured_tps:.0f}")
        return " · ".join(parts)

    def tooltip(self) -> str:
        lines = []
        if self.predicted_tps is not None:
            lines.append(
                f"Predicted on this machine: ~{self.predicted_tps:.0f} tokens/s for a chat "
                "reply at the default sampling."
            )
            lines.append(self.basis)
        if self.measured_tps is not None:
            lines.append(
                f"Measured: {self.measured_tps:.1f} tokens/s (median of {self.measured_n} "
                f"{self.measured_source or 'chat'} repl{'y' if self.measured_n == 1 else 'ies'}; "
                "decode time only)."
            )
            if self.predicted_tps:
                lines.append(f"Measured / predicted: {self.measured_tps / self.predicted_tps:.2f}")
        return "\n".join(lines)


class SpeedRecords:
    """Per file key: the latest prediction and the measured speeds, in one JSON file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def get(self, key: str) -> dict[str, Any]:
        entry = self._read().get(key)
        return entry if isinstance(entry, dict) else {}

    def all(self) -> dict[str, Any]:
        return self._read()

    def predicted(self, key: str, prediction: SpeedPrediction) -> None:
        self._update(key, "predicted", {**prediction.to_dict(), "at": _now()})

    def measured(self, key: str, tokens_per_s: float, source: str = "chat") -> dict[str, Any]:
        """Add one measured speed; returns the entry's measured part (its median so far)."""
        with self._lock:
            data = self._read()
            entry = _dict(data.get(key))
            old = _dict(entry.get("measured"))
            samples = [float(x) for x in old.get("samples", []) if isinstance(x, int | float)]
            samples = [*samples, float(tokens_per_s)][-KEEP_SAMPLES:]
            measured = {
                "tokens_per_s": statistics.median(samples),
                "samples": samples,
                "source": source,
                "at": _now(),
            }
            entry["measured"] = measured
            data[key] = entry
            self._write(data)
            return measured

    def view(self, key: str, prediction: SpeedPrediction | None) -> SpeedView:
        entry = self.get(key)
        m = entry.get("measured") if isinstance(entry.get("measured"), dict) else None
        p = prediction
        if p is None and isinstance(entry.get("predicted"), dict):
            stored = entry["predicted"]
            return SpeedView(
                float(stored["tokens_per_s"]) if "tokens_per_s" in stored else None,
                "Predicted earlier on this machine.",
                *_measured(m),
            )
        return SpeedView(
            p.tokens_per_s if p is not None else None,
            p.basis() if p is not None else "",
            *_measured(m),
        )

    def _update(self, key: str, part: str, value: Mapping[str, Any]) -> None:
        with self._lock:
            data = self._read()
            entry = _dict(data.get(key))
            entry[part] = dict(value)
            data[key] = entry
            self._write(data)

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write(self, data: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.path, json.dumps(data, indent=1, sort_keys=True))


def _dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def _measured(m: Mapping[str, Any] | None) -> tuple[float | None, int, str]:
    if not m or "tokens_per_s" not in m:
        return None, 0, ""
    return float(m["tokens_per_s"]), len(m.get("samples") or []), str(m.get("source") or "")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class SpeedService:
    """Predictions for headers and files, and the measured speeds, for the app and the CLI.

    `profile`: this machine's figures (default: measured into `<data>/speed_profile.json`)."""

    def __init__(self, data_dir: Path, profile: SpeedProfile | None = None) -> None:
        self.profile = profile or SpeedProfile(data_dir / "speed_profile.json")
        self.records = SpeedRecords(data_dir / "speed_records.json")
        self._lock = threading.Lock()  # one probe at a time
        self._costs: dict[tuple[str, int, int], DecodeCost] = {}  # local headers, read once

    @property
    def settings(self) -> ProbeSettings:
        return self.profile.settings

    def cost(self, gf: GGUFFile) -> DecodeCost:
        return DecodeCost.of(
            gf, features=cpu_kernels.detect(), extra_buffers=self.settings.extra_buffers
        )

    def predict_header(self, gf: GGUFFile, key: str | None = None) -> SpeedPrediction:
        """Measures what this machine has not measured yet (slow the first time)."""
        cost = self.cost(gf)
        with self._lock:
            machine = self.profile.machine(cost.matmul_bytes.keys())
        prediction = predict(cost, machine)
        if key is not None:
            self.records.predicted(key, prediction)
        return prediction

    def predict_file(self, path: Path) -> SpeedPrediction:
        """A local model's prediction, measuring what this machine has not yet (slow)."""
        return self.predict_header(read_gguf(path), file_key(path.name, path.stat().st_size))

    def view_for_file(self, path: Path) -> SpeedView | None:
        """A local model, never measuring (the GUI thread asks): predicted from its header
        when this machine's figures cover its kernels, and what was measured on it; None
        when neither is known."""
        st = path.stat()
        key = file_key(path.name, st.st_size)
        ident = (str(path), st.st_size, st.st_mtime_ns)
        cost = self._costs.get(ident)
        if cost is None:
            cost = self._costs[ident] = self.cost(read_gguf(path))
        machine = self.profile.known(cost.matmul_bytes.keys())
        view = self.records.view(key, predict(cost, machine) if machine is not None else None)
        return view if view.predicted_tps is not None or view.measured_tps is not None else None

    def record_measured(self, path: Path, tokens_per_s: float, tokens: int) -> bool:
        """A chat reply's decode speed on a local model; False when too short to count."""
        if tokens < MIN_TOKENS or tokens_per_s <= 0:
            return False
        self.records.measured(file_key(path.name, path.stat().st_size), tokens_per_s)
        return True


__all__ = ["SpeedRecords", "SpeedService", "SpeedView", "file_key"]
