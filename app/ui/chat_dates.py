"""Short dates for the chats list: the time today, "Yesterday", the weekday within a week,
the day and month this year, the full date before."""

from __future__ import annotations

from datetime import datetime


def short_when(ts: float, now: float) -> str:
    t, n = datetime.fromtimestamp(ts), datetime.fromtimestamp(now)
    days = (n.date() - t.date()).days
    clock = t.strftime("%H:%M")
    if days <= 0:
        return clock
    if days == 1:
        return f"Yesterday {clock}"
    if days < 7:
        return f"{t.strftime('%a')} {clock}"
    if t.year == n.year:
        return f"{t.day} {t.strftime('%b')}"
    return f"{t.day} {t.strftime('%b')} {t.year}"


__all__ = ["short_when"]
