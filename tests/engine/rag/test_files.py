"""Walking a collection: what is found, what is skipped with which reason, and no crash."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.rag.files import MAX_FILE_BYTES, Found, Skipped, format_size, walk


def found(items: list[Found | Skipped]) -> list[Path]:
    return [i.path for i in items if isinstance(i, Found)]


def skipped(items: list[Found | Skipped]) -> dict[Path, str]:
    return {i.path: i.reason for i in items if isinstance(i, Skipped)}


def make(root: Path, *names: str) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"text of {name}\n")


def test_finds_supported_files_in_name_order_with_their_stat(tmp_path: Path) -> None:
    make(tmp_path, "b.md", "a.txt", "sub/c.py", "sub/deeper/d.pdf", "z/e.html")
    items = list(walk([tmp_path]))
    root = tmp_path.resolve()
    assert found(items) == [
        root / "a.txt", root / "b.md", root / "sub/c.py", root / "sub/deeper/d.pdf",
        root / "z/e.html",
    ]  # fmt: skip
    first = items[0]
    assert isinstance(first, Found)
    st = os.stat(root / "a.txt")
    assert (first.size, first.mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert skipped(items) == {}


def test_hidden_and_tool_folders_are_left_out_silently(tmp_path: Path) -> None:
    make(tmp_path, "keep.md", ".git/config.txt", "node_modules/x/readme.md",
         "pkg/__pycache__/m.py", ".hidden.txt", ".venv/lib/site.py")  # fmt: skip
    items = list(walk([tmp_path]))
    assert found(items) == [tmp_path.resolve() / "keep.md"]
    assert skipped(items) == {}


def test_unsupported_files_are_reported(tmp_path: Path) -> None:
    make(tmp_path, "notes.txt")
    (tmp_path / "photo.jpg").write_bytes(b"\xff\xd8")
    items = list(walk([tmp_path]))
    assert skipped(items) == {tmp_path.resolve() / "photo.jpg": "not a supported format"}


def test_huge_sparse_file_is_skipped_by_size(tmp_path: Path) -> None:
    huge = tmp_path / "dump.txt"
    # A sparse 2 GiB file: it takes no disk space, only its size is big.
    subprocess.run(["truncate", "-s", "2G", str(huge)], check=True)
    make(tmp_path, "small.txt")
    items = list(walk([tmp_path]))
    assert found(items) == [tmp_path.resolve() / "small.txt"]
    assert skipped(items) == {huge.resolve(): "too large (2.0 GB > 50 MB limit)"}
    assert MAX_FILE_BYTES == 50 * 1024 * 1024


def test_size_limit_is_a_parameter(tmp_path: Path) -> None:
    (tmp_path / "big.txt").write_text("x" * 2000)
    items = list(walk([tmp_path], max_bytes=1024))
    assert skipped(items) == {tmp_path.resolve() / "big.txt": "too large (2.0 KB > 1.0 KB limit)"}


def test_format_size() -> None:
    assert format_size(512) == "512 bytes"
    assert format_size(1536) == "1.5 KB"
    assert format_size(50 * 1024**2) == "50 MB"
    assert format_size(2 * 1024**3) == "2.0 GB"


def test_symlink_loop_is_skipped_and_files_under_it_listed_once(tmp_path: Path) -> None:
    make(tmp_path, "docs/a.txt", "docs/inner/b.txt")
    (tmp_path / "docs/inner/back").symlink_to(tmp_path / "docs")  # points at an ancestor
    items = list(walk([tmp_path]))
    root = tmp_path.resolve()
    assert found(items) == [root / "docs/a.txt", root / "docs/inner/b.txt"]
    assert skipped(items) == {root / "docs/inner/back": "symlink loop"}


def test_symlink_to_a_folder_already_walked_is_not_a_loop(tmp_path: Path) -> None:
    make(tmp_path, "a/one.txt")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    items = list(walk([tmp_path]))
    assert found(items) == [tmp_path.resolve() / "a/one.txt"]
    assert skipped(items) == {tmp_path.resolve() / "b": "folder already included"}


def test_self_referencing_symlink_and_broken_symlink(tmp_path: Path) -> None:
    make(tmp_path, "ok.txt")
    (tmp_path / "self.txt").symlink_to(tmp_path / "self.txt")
    (tmp_path / "dangling.txt").symlink_to(tmp_path / "nowhere.txt")
    items = list(walk([tmp_path]))
    assert found(items) == [tmp_path.resolve() / "ok.txt"]
    assert skipped(items) == {
        tmp_path / "self.txt": "symlink loop",
        tmp_path / "dangling.txt": "broken symlink",
    }


def test_symlinks_to_files_are_followed_and_each_file_listed_once(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    make(outside, "target.md")
    collection = tmp_path / "collection"
    collection.mkdir()
    (collection / "link.md").symlink_to(outside / "target.md")
    (collection / "link2.md").symlink_to(outside / "target.md")
    items = list(walk([collection, outside]))
    assert found(items) == [outside.resolve() / "target.md"]  # the resolved path, once


def test_folder_that_disappears_during_the_walk(tmp_path: Path) -> None:
    make(tmp_path, "a/first.txt", "b/second.txt", "c/third.txt")
    items: list[Found | Skipped] = []
    for item in walk([tmp_path]):
        items.append(item)
        if isinstance(item, Found) and item.path.name == "first.txt":
            shutil.rmtree(tmp_path / "b")  # removed after the walk listed it
    root = tmp_path.resolve()
    assert found(items) == [root / "a/first.txt", root / "c/third.txt"]
    assert skipped(items) == {root / "b": "folder disappeared"}


def test_permission_denied_folder_is_skipped_and_the_walk_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tests run as root, who may list any folder: the refusal is simulated at os.scandir.
    make(tmp_path, "open/a.txt", "private/b.txt", "z.txt")
    private = tmp_path.resolve() / "private"
    real_scandir = os.scandir

    def scandir(path: Any) -> Iterator[os.DirEntry[str]]:
        if Path(path) == private:
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    items = list(walk([tmp_path]))
    root = tmp_path.resolve()
    assert found(items) == [root / "z.txt", root / "open/a.txt"]
    assert skipped(items) == {private: "permission denied"}


def test_fifo_and_other_special_files_are_not_regular(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.txt")
    items = list(walk([tmp_path]))
    assert skipped(items) == {tmp_path.resolve() / "pipe.txt": "not a regular file"}


def test_roots_may_be_files_missing_or_repeated(tmp_path: Path) -> None:
    make(tmp_path, "dir/a.txt", "single.md")
    items = list(walk([tmp_path / "single.md", tmp_path / "dir", tmp_path / "missing",
                       tmp_path / "dir"]))  # fmt: skip
    root = tmp_path.resolve()
    assert found(items) == [root / "single.md", root / "dir/a.txt"]
    assert skipped(items) == {
        tmp_path / "missing": "not found",
        root / "dir": "folder already included",
    }
