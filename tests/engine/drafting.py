"""Drafting held on for tests of what drafts do (exact output, a clean KV cache, stats).

The loop drafts only while drafting measures faster on this machine, and sizes lookup drafts
with the costs it measured (engine.host.draft_gain): timings, which a loaded machine makes
anything. Tests of the drafts themselves hold that side of the switch with `always_draft`;
tests/engine/test_draft_gain.py drives the switch itself with a fake clock.
"""

from __future__ import annotations

import pytest

from engine.host.draft_gain import DraftGain, MeasuredCost


@pytest.fixture
def always_draft(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every draft allowed; lookup sizes drafts with the kernel table's curve, as before the
    loop measured anything."""
    monkeypatch.setattr(DraftGain, "allow", lambda _self, _busy, _kind: True)
    monkeypatch.setattr(MeasuredCost, "measured", lambda _self, _n: None)


__all__ = ["always_draft"]
