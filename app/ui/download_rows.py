"""A download job's cells in the Models page's Downloads table: its status, progress and
speed in words."""

from __future__ import annotations

from app.services.download_jobs import (
    DONE,
    DOWNLOADING,
    FAILED,
    PAUSED,
    QUEUED,
    VERIFYING,
    DownloadJob,
)
from engine.model.gguf import human_bytes


def status_text(j: DownloadJob) -> str:
    return {
        DONE: "verified",
        FAILED: "failed",
        PAUSED: "paused",
        QUEUED: "queued",
        DOWNLOADING: "downloading",
        VERIFYING: "verifying",
    }.get(j.status, j.status)


def progress_text(j: DownloadJob) -> str:
    if not j.size:
        return human_bytes(j.done_bytes)
    return f"{human_bytes(j.done_bytes)} / {human_bytes(j.size)} ({100 * j.fraction:.0f}%)"


def speed_text(j: DownloadJob) -> str:
    if j.status != DOWNLOADING or j.speed_bps <= 0:
        return ""
    eta = j.eta_s
    return f"{human_bytes(j.speed_bps)}/s" + (f", {int(eta)} s left" if eta is not None else "")
