"""The model host: the one owner of the models loaded in a process, by name.

Every client finds a model here: the desktop chat (the engine thread loads into it), the
desktop's local server (which serves what the chat has loaded: no second instance),
`candlewick serve`, `candlewick run`. A loaded model has one llama.cpp context and one decode
loop (`Model.loop`); requests go there. A request for a name that is not loaded is refused with
one line.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from engine.errors import EngineError
from engine.host.runtime import Model


class ModelNotLoaded(EngineError):
    """No model of that name is loaded."""


class ModelHost:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._models: dict[str, Model] = {}
        self._listeners: list[Callable[[str, Model | None], None]] = []

    def add(self, name: str, model: Model) -> None:
        """Make a loaded model available as `name` (a file is loaded once: the same model
        object may not be added under a second name)."""
        with self._lock:
            for other, m in self._models.items():
                if m is model and other != name:
                    raise EngineError(f"{model.path.name} is already loaded as {other!r}")
            if name in self._models and self._models[name] is not model:
                raise EngineError(f"a model named {name!r} is already loaded")
            self._models[name] = model
            listeners = list(self._listeners)
        for fn in listeners:
            fn(name, model)

    def get(self, name: str) -> Model:
        with self._lock:
            model = self._models.get(name)
            names = sorted(self._models)
        if model is None:
            loaded = f"loaded: {', '.join(names)}" if names else "no model is loaded"
            raise ModelNotLoaded(f"model {name!r} is not loaded ({loaded})")
        return model

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._models)

    def remove(self, name: str) -> Model | None:
        """Forget `name` (the caller frees the model); listeners hear it is gone first."""
        with self._lock:
            model = self._models.pop(name, None)
            listeners = list(self._listeners)
        if model is not None:
            for fn in listeners:
                fn(name, None)
        return model

    def unload(self, name: str) -> None:
        model = self.remove(name)
        if model is not None:
            model.close()

    def on_change(self, fn: Callable[[str, Model | None], None]) -> Callable[[], None]:
        """Call `fn(name, model)` when a model is added, `fn(name, None)` before one goes
        (on the thread that adds or removes it). Returns the call that stops it."""
        with self._lock:
            self._listeners.append(fn)

        def unsubscribe() -> None:
            with self._lock, contextlib.suppress(ValueError):
                self._listeners.remove(fn)

        return unsubscribe

    def close(self) -> None:
        for name in self.names():
            self.unload(name)


__all__ = ["ModelHost", "ModelNotLoaded"]
