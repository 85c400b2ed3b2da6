"""Settings per model: the load settings and sampling defaults a user chose for one model,
remembered in the profile and applied wherever that model is loaded (the window's Load, a
request that names it through the Local server or `candlewick serve`, `candlewick run`).

Qt-free. One JSON file in the profile's config folder, keyed by the model file's resolved
path (the library's own key for a model: its user-given name is kept the same way). Every
value is checked on read: a value that is not valid is dropped with a one-line message, the
model's other values and the other models' entries stay, and a file that cannot be read at
all gives the defaults (and is set aside, not overwritten, on the next save).

Precedence wherever a model is loaded: a command-line flag > saved for this model > the
defaults of the place that loads it (the Local server's slots, `serve`'s options).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from app.services.atomic_write import write_text_atomic
from app.services.paths import AppPaths
from engine.errors import EngineError
from engine.settings import KV_TYPES, LoadParams, SamplingParams, SpeculativeSettings

log = logging.getLogger("candlewick.model_settings")

FILE_NAME = "model_settings.json"
VERSION = 1
Source = Literal["default", "saved for this model"]
DEFAULT: Source = "default"
SAVED: Source = "saved for this model"
SettingsProvider = Callable[[str | Path], LoadParams | None]


# -- what may be saved, each checked once ------------------------------------------------------


def _int(lo: int, hi: int | None = None) -> Callable[[object], int]:
    def check(v: object) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
            raise ValueError(
                f"a whole number from {lo} to {hi} was expected"
                if hi is not None
                else f"a whole number of at least {lo} was expected"
            )
        return v

    return check


def _float(lo: float, hi: float | None = None) -> Callable[[object], float]:
    def check(v: object) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError("a number was expected")
        f = float(v)
        if f < lo or (hi is not None and f > hi):
            raise ValueError(
                f"a number from {lo} to {hi} was expected"
                if hi is not None
                else f"a number of at least {lo} was expected"
            )
        return f

    return check


def _choice(*allowed: str) -> Callable[[object], str]:
    def check(v: object) -> str:
        if v not in allowed:
            raise ValueError(f"one of {', '.join(allowed)} was expected")
        return str(v)

    return check


def _gpu_layers(v: object) -> int | str:
    if v in ("auto", "all"):
        return str(v)
    return _int(0)(v)


def _text(v: object) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError("a path was expected")
    return v


# The load settings: LoadParams' own names, plus speculative decoding as the panel shows it.
LOAD_KEYS: dict[str, Callable[[object], Any]] = {
    "n_ctx": _int(16),
    "n_gpu_layers": _gpu_layers,
    "n_threads": _int(1),
    "type_k": _choice(*KV_TYPES),
    "type_v": _choice(*KV_TYPES),
    "flash_attn": _choice("auto", "on", "off"),
    "mmproj": _text,
    "speculative": _choice("off", "lookup", "draft"),
    "draft_model": _text,
    "draft_max": _int(0, 64),
}
# Sampling defaults: SamplingParams' names.
SAMPLING_KEYS: dict[str, Callable[[object], Any]] = {
    "temperature": _float(0.0),
    "top_p": _float(0.0, 1.0),
    "top_k": _int(0),
    "min_p": _float(0.0, 1.0),
    "repeat_penalty": _float(0.0),
    "max_tokens": _int(1),
}
KEYS: dict[str, Callable[[object], Any]] = {**LOAD_KEYS, **SAMPLING_KEYS}
# What an API request's on-demand load takes from a model's settings: drafting loads a second
# model (a server chooses that for all its models: `serve --lookup`), so it stays the window's.
SERVED_KEYS = ("n_ctx", "n_gpu_layers", "n_threads", "type_k", "type_v", "flash_attn", "mmproj")


def check_value(key: str, value: object) -> Any:
    """The value as saved, or ValueError with one line naming the key."""
    if key not in KEYS:
        raise ValueError(f"unknown setting {key!r} (known: {', '.join(KEYS)})")
    try:
        return KEYS[key](value)
    except ValueError as e:
        raise ValueError(f"{key}: {value!r} is not valid ({e})") from None


def parse_value(key: str, text: str) -> Any:
    """A value typed on the command line (`n_ctx=8192`, `n_gpu_layers=all`), checked."""
    try:
        value: object = json.loads(text)
    except ValueError:
        value = text  # a bare word: auto, q8_0, a path
    return check_value(key, value)


@dataclass(frozen=True)
class Setting:
    key: str
    value: Any
    source: Source


@dataclass(frozen=True)
class ModelSettings:
    """One model's saved values (checked); everything not saved is the caller's default."""

    saved: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def source(self) -> Source:
        return SAVED if self.saved else DEFAULT

    def describe(
        self, load: LoadParams | None = None, sampling: SamplingParams | None = None
    ) -> list[Setting]:
        """Every setting with its value and where it comes from."""
        load = load or LoadParams()
        sampling = sampling or SamplingParams()
        spec = load.speculative
        defaults: dict[str, Any] = {
            **{k: getattr(load, k) for k in LOAD_KEYS if hasattr(load, k)},
            "speculative": spec.mode if spec is not None else "off",
            "draft_model": spec.draft_model if spec is not None else None,
            "draft_max": (spec.draft_max or 0) if spec is not None else 0,
            **{k: getattr(sampling, k) for k in SAMPLING_KEYS},
        }
        return [
            Setting(k, self.saved[k], SAVED)
            if k in self.saved
            else Setting(k, defaults[k], DEFAULT)
            for k in KEYS
        ]

    def load_params(
        self,
        base: LoadParams | None = None,
        *,
        slots: int = 1,
        keys: Collection[str] = tuple(LOAD_KEYS),
        keep: Collection[str] = (),
    ) -> LoadParams:
        """`base` with this model's saved load settings over it. `slots`: sequences sharing
        the context (a saved context is each one's, as Ollama's num_ctx is per request);
        `keys`: which saved values apply; `keep`: base values that win (flags given)."""
        base = base or LoadParams()
        use = {
            k: v for k, v in self.saved.items() if k in keys and k in LOAD_KEYS and k not in keep
        }
        changes: dict[str, Any] = {}
        for k in ("n_gpu_layers", "n_threads", "type_k", "type_v", "flash_attn", "mmproj"):
            if k in use:
                changes[k] = use[k]
        if "n_ctx" in use:
            changes["n_ctx"] = use["n_ctx"] * max(slots, 1)
        if "speculative" in use:
            mode = use["speculative"]
            changes["speculative"] = (
                None
                if mode == "off"
                else SpeculativeSettings(
                    mode,
                    draft_model=use.get("draft_model") if mode == "draft" else None,
                    draft_max=use.get("draft_max") or None,
                )
            )
        params = dataclasses.replace(base, **changes)
        try:
            params.validate()
        except EngineError as e:
            # Saved values that do not go together (a quantized V cache with flash attention
            # off): the caller's settings load, with one line saying why.
            log.warning("saved settings not used: %s", e)
            return base
        return params

    def sampling(self, base: SamplingParams | None = None) -> SamplingParams:
        base = base or SamplingParams()
        return dataclasses.replace(
            base, **{k: v for k, v in self.saved.items() if k in SAMPLING_KEYS}
        )


class ModelSettingsStore:
    """The profile's settings per model. Thread-safe; the file is read again when it
    changes on disk (the window and the CLI share it), so callers keep one store."""

    def __init__(self, path: Path, *, warn: Callable[[str], None] | None = None) -> None:
        self.path = Path(path)
        self._warn = warn or log.warning
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._raw: dict[str, Any] = {}
        self._checked: dict[str, ModelSettings] = {}
        self._unreadable = False
        self.problem: str | None = None  # the last read's one-line complaint, if any

    @classmethod
    def for_paths(cls, paths: AppPaths | None = None) -> ModelSettingsStore:
        return cls((paths or AppPaths.default()).config / FILE_NAME)

    @staticmethod
    def key(model: str | Path) -> str:
        p = Path(model).expanduser()
        try:
            return str(p.resolve())
        except OSError:
            return str(p)

    # -- reading ----------------------------------------------------------------------------

    def _refresh(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._stamp, self._raw, self._checked, self._unreadable = None, {}, {}, False
            self.problem = None
            return
        except OSError as e:
            self._complain(f"cannot read {self.path.name}: {e.strerror or e}; using defaults")
            self._raw, self._checked, self._unreadable = {}, {}, True
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        self._stamp, self._checked, self._unreadable = stamp, {}, False
        self.problem = None
        try:
            data = json.loads(self.path.read_text("utf-8"))
            if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
                raise ValueError("it does not hold a 'models' table")
        except (OSError, ValueError) as e:
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            self._complain(f"{self.path.name} cannot be read ({why}); using the defaults")
            self._raw, self._unreadable = {}, True
            return
        self._raw = dict(data["models"])

    def _complain(self, line: str) -> None:
        if line != self.problem:
            self._warn(line)
        self.problem = line

    def _checked_entry(self, key: str) -> ModelSettings:
        if key in self._checked:
            return self._checked[key]
        raw = self._raw.get(key)
        saved: dict[str, Any] = {}
        if raw is not None and not isinstance(raw, dict):
            self._complain(f"{self.path.name}: the entry for {Path(key).name} is not a table")
        elif raw:
            for k, v in raw.items():
                try:
                    saved[k] = check_value(k, v)
                except ValueError as e:
                    self._complain(f"{self.path.name}: {Path(key).name}: {e}; using the default")
        self._checked[key] = ModelSettings(saved)
        return self._checked[key]

    def get(self, model: str | Path) -> ModelSettings:
        with self._lock:
            self._refresh()
            return self._checked_entry(self.key(model))

    def models(self) -> list[str]:
        """The keys (resolved paths) of the models with saved settings."""
        with self._lock:
            self._refresh()
            return sorted(k for k, v in self._raw.items() if v)

    # -- writing ----------------------------------------------------------------------------

    def save(self, model: str | Path, values: Mapping[str, Any]) -> ModelSettings:
        """Replace the model's saved values (checked: ValueError names a bad one)."""
        checked = {k: check_value(k, v) for k, v in values.items() if v is not None}
        return self._write(self.key(model), checked)

    def update(self, model: str | Path, changes: Mapping[str, Any]) -> ModelSettings:
        """Change some values; None removes a value (back to the default)."""
        current = dict(self.get(model).saved)
        for k, v in changes.items():
            if v is None:
                if k not in KEYS:
                    raise ValueError(f"unknown setting {k!r} (known: {', '.join(KEYS)})")
                current.pop(k, None)
            else:
                current[k] = check_value(k, v)
        return self._write(self.key(model), current)

    def clear(self, model: str | Path) -> None:
        self._write(self.key(model), {})

    def _write(self, key: str, values: dict[str, Any]) -> ModelSettings:
        with self._lock:
            self._refresh()
            if self._unreadable and self.path.exists():
                # Nothing the user had is lost: the unreadable file is kept beside the new one.
                aside = self.path.with_name(self.path.name + ".bad")
                os.replace(self.path, aside)
                self._warn(f"{self.path.name} could not be read: kept as {aside.name}")
            models = dict(self._raw)  # other models' entries as they were, checked or not
            if values:
                models[key] = values
            else:
                models.pop(key, None)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            text = json.dumps({"version": VERSION, "models": models}, indent=1, ensure_ascii=False)
            write_text_atomic(self.path, text + "\n")
            self._stamp, self._unreadable, self.problem = None, False, None
            self._refresh()
            return self._checked_entry(key)

    # -- applying ---------------------------------------------------------------------------

    def provider(
        self,
        base: LoadParams | None = None,
        *,
        slots: int = 1,
        keys: Collection[str] = SERVED_KEYS,
        keep: Collection[str] = (),
    ) -> SettingsProvider:
        """A function from a model file to its load settings (`base` with its saved values
        over it, see `ModelSettings.load_params`), or None when nothing is saved for it."""

        def params(model: str | Path) -> LoadParams | None:
            s = self.get(model)
            if not any(k in s.saved for k in keys):
                return None
            return s.load_params(base, slots=slots, keys=keys, keep=keep)

        return params


__all__ = [
    "DEFAULT",
    "FILE_NAME",
    "KEYS",
    "LOAD_KEYS",
    "SAMPLING_KEYS",
    "SAVED",
    "SERVED_KEYS",
    "ModelSettings",
    "ModelSettingsStore",
    "Setting",
    "SettingsProvider",
    "Source",
    "check_value",
    "parse_value",
]
