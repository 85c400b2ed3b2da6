"""The X-server tier: the real window on a real X server (Qt's xcb platform on Xvfb), with
assertions on what the screen shows.

Qt picks its platform once per process, and the rest of the suite runs offscreen, so the
scenarios (marked `xserver`) are left out of an offscreen session; `test_xserver_tier.py`
starts Xvfb and runs them there in a child pytest. Under an X server already
(`QT_QPA_PLATFORM=xcb`), they run in the session itself.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.app.ui.visual.xserver import Xvfb, on_xserver, start_xvfb


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if on_xserver():
        return
    drop = [i for i in items if i.get_closest_marker("xserver")]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [i for i in items if not i.get_closest_marker("xserver")]


@pytest.fixture
def xvfb() -> Iterator[Xvfb]:
    with start_xvfb() as x:
        yield x
