"""The standard Hugging Face hub cache: where huggingface_hub, and every tool built on it, keeps
a repository's files, so a file Candlewick downloads is one those tools find too.

Layout:
    <HF hub cache>/models--owner--name/blobs/<sha256>[.incomplete]
    <HF hub cache>/models--owner--name/snapshots/<commit>/<file> -> ../../blobs/<sha256>
    <HF hub cache>/models--owner--name/refs/<branch>           (the commit)

`<blob>.incomplete` is huggingface_hub's own name for a partial blob, so either tool can finish
the other's download. Small files that are not in Git LFS are named by their git blob SHA-1.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache, read from the environment now (HF_HUB_CACHE, HF_HOME)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def repo_folder(cache: Path, repo_id: str) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--"))


def blob_path(cache: Path, repo_id: str, blob: str) -> Path:
    """Where the verified bytes named `blob` (their hash) live."""
    return repo_folder(cache, repo_id) / "blobs" / blob


def incomplete_blob_path(cache: Path, repo_id: str, blob: str) -> Path:
    """Where the bytes of `blob` gather while they arrive."""
    return repo_folder(cache, repo_id) / "blobs" / f"{blob}.incomplete"


def link_into_snapshot(cache: Path, repo_id: str, blob: str, snapshot: str, filename: str) -> Path:
    """Make `snapshots/<snapshot>/<filename>` point at the blob, as huggingface_hub does, and
    return that path: the file as every tool opens it."""
    target = blob_path(cache, repo_id, blob)
    link = repo_folder(cache, repo_id) / "snapshots" / snapshot / filename
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        with contextlib.suppress(FileNotFoundError):
            link.unlink()  # a dangling link
        try:
            link.symlink_to(os.path.relpath(target, link.parent))
        except OSError:
            # No symlinks (Windows without developer mode): huggingface_hub copies too.
            shutil.copyfile(target, link)
    return link


def write_ref(cache: Path, repo_id: str, ref: str, commit: str) -> None:
    """Record that the branch or tag `ref` names `commit`."""
    refs = repo_folder(cache, repo_id) / "refs" / ref
    refs.parent.mkdir(parents=True, exist_ok=True)
    refs.write_text(commit)


def remove_empty_dirs(folder: Path, *, stop_at: Path) -> None:
    """Remove `folder` and its parents while they are empty, never `stop_at` or above it."""
    p = folder
    try:
        stop = stop_at.resolve()
    except OSError:
        return
    while p.resolve() != stop and stop in p.resolve().parents:
        try:
            p.rmdir()
        except OSError:
            return
        p = p.parent


__all__ = [
    "blob_path",
    "hf_hub_cache",
    "incomplete_blob_path",
    "link_into_snapshot",
    "remove_empty_dirs",
    "repo_folder",
    "write_ref",
]
