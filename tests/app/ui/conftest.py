"""Qt fixtures: fail a test that leaves a QThread or QTimer running."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from PySide6.QtCore import QThread, QTimer
from PySide6.QtWidgets import QApplication


def _running_qt_objects() -> list[str]:
    # Only objects of a QThread or QTimer class are looked at: the classes present are found
    # at C speed (`map(type, ...)`), which keeps this check cheap on a heap of ~350k objects.
    objs = gc.get_objects()
    # type() rather than isinstance(): isinstance asks the object for __class__, and lazy
    # module proxies (the openai package has some) import their module when asked.
    qt_types = {c for c in set(map(type, objs)) if issubclass(c, (QThread, QTimer))}
    running = []
    for obj in objs:
        cls = type(obj)
        if cls not in qt_types:
            continue
        try:
            if issubclass(cls, QThread) and obj.isRunning():
                running.append(f"QThread {obj.objectName() or obj!r}")
            elif issubclass(cls, QTimer) and obj.isActive():
                parent = obj.parent()
                running.append(f"QTimer of {type(parent).__name__ if parent else None}")
        except RuntimeError:  # the C++ object is already gone
            continue
    return running


@pytest.fixture(autouse=True)
def no_running_qt_objects(qapp: QApplication) -> Iterator[None]:
    """Autouse fixtures set up first and tear down last: this runs after a test's own
    fixtures have closed their windows and engine threads."""
    yield
    for _ in range(3):
        qapp.processEvents()
    left = _running_qt_objects()
    if left:  # what garbage collection frees (and so stops) is not a leak
        gc.collect()
        left = _running_qt_objects()
    assert not left, f"test left Qt threads/timers running: {left}"
