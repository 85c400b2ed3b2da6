"""The default embedding model: made once from the installed package (the real conversion and
llama.cpp's check), listed by the library once and reused; a conversion that fails (a full disk,
a file that does not embed) leaves nothing under the real name; a missing package is one line."""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.services import default_embedding
from app.services.default_embedding import (
    DISTRIBUTION,
    FILE_NAME,
    DefaultEmbedding,
    DefaultEmbeddingError,
)
from app.services.library import ModelLibrary
from engine.errors import EngineError


def library(models: Path) -> ModelLibrary:
    return ModelLibrary(models, bundled=False, discovery=False)


def leftovers(models: Path) -> list[str]:
    return sorted(p.name for p in models.iterdir()) if models.is_dir() else []


@pytest.mark.slow
@pytest.mark.model
def test_made_once_checked_listed_and_reused(tmp_path: Path) -> None:
    models = tmp_path / "models"
    writes: list[Path] = []
    told: list[str] = []

    def counting(folder: Path, out: Path) -> None:
        writes.append(out)
        default_embedding.write_gguf(folder, out, name=default_embedding.MODEL_NAME)

    made = DefaultEmbedding(models, write=counting)
    assert not made.ready()
    path = made.ensure(before_making=lambda: told.append("making"))
    assert path == models / FILE_NAME and made.ready()
    assert len(writes) == 1 and writes[0] != path  # written under another name, then renamed
    assert told == ["making"] and leftovers(models) == [FILE_NAME]
    # Again, in this process and in another one (a new instance): the file is used as it is.
    mtime = path.stat().st_mtime_ns
    assert made.ensure(before_making=lambda: told.append("again")) == path
    assert DefaultEmbedding(models, write=counting).ensure() == path
    assert len(writes) == 1 and told == ["making"] and path.stat().st_mtime_ns == mtime
    # The library lists it once, by a stable id, as the embedding model it is.
    [entry] = [e for e in library(models).entries() if e.path == path]
    assert entry.id == "all-minilm-l6-v2" and entry.error is None
    assert entry.facts is not None and entry.facts.embedding_only
    assert entry.facts.n_embd == default_embedding.DIM
    assert len(library(models).entries()) == 1


@contextlib.contextmanager
def no_package_folder(_zip: Path | None = None) -> Iterator[Path]:
    yield Path("unused")


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """No zip extracted: the failure tests fail in the writing or the check."""
    monkeypatch.setattr(default_embedding, "model_folder", no_package_folder)


def test_a_full_disk_leaves_no_file(tmp_path: Path, quick: None) -> None:
    models = tmp_path / "models"

    def fill_the_disk(_folder: Path, out: Path) -> None:
        out.write_bytes(b"GGUF" + b"\0" * 4096)  # a header's start: a file that looks begun
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    made = DefaultEmbedding(models, write=fill_the_disk, verify=lambda _p: None)
    with pytest.raises(DefaultEmbeddingError) as e:
        made.ensure()
    assert str(e.value) == (
        f"could not make the default embedding model in {models}: No space left on device"
    )
    assert leftovers(models) == [] and not made.ready()
    assert library(models).entries() == []


def test_a_file_that_fails_the_check_is_not_kept(tmp_path: Path, quick: None) -> None:
    models = tmp_path / "models"
    checked: list[Path] = []

    def write(_folder: Path, out: Path) -> None:
        out.write_bytes(b"not a model")

    def refuse(path: Path) -> None:
        checked.append(path)
        assert path.exists() and path.name != FILE_NAME  # checked before the rename
        raise EngineError("llama.cpp could not load it")

    with pytest.raises(EngineError, match="could not load it"):
        DefaultEmbedding(models, write=write, verify=refuse).ensure()
    assert len(checked) == 1 and leftovers(models) == []


def test_a_truncated_file_is_made_again(tmp_path: Path, quick: None) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / FILE_NAME).write_bytes(b"GGUF\x03\0\0\0")  # cut short by a crash of another tool
    made = DefaultEmbedding(
        models, write=lambda _f, out: out.write_bytes(b"made again"), verify=lambda _p: None
    )
    assert not made.ready()
    assert made.ensure() == models / FILE_NAME
    assert (models / FILE_NAME).read_bytes() == b"made again" and leftovers(models) == [FILE_NAME]


def test_a_killed_conversion_s_part_file_is_removed_later(tmp_path: Path, quick: None) -> None:
    models = tmp_path / "models"
    models.mkdir()
    stale, fresh = models / f".{FILE_NAME}.dead.part", models / f".{FILE_NAME}.busy.part"
    for p in (stale, fresh):
        p.write_bytes(b"GGUF")
    old = time.time() - 2 * default_embedding.STALE_PART_S
    os.utime(stale, (old, old))

    def fail(_folder: Path, _out: Path) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    with pytest.raises(DefaultEmbeddingError):
        DefaultEmbedding(models, write=fail).ensure()
    assert leftovers(models) == [fresh.name]  # another process's conversion is left alone


def test_without_the_package_one_line_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(default_embedding, "PACKAGE", "candlewick_no_such_package")
    with pytest.raises(DefaultEmbeddingError) as e:
        DefaultEmbedding(tmp_path / "models").ensure()
    message = str(e.value)
    assert f"pip install {DISTRIBUTION}" in message and "\n" not in message
    assert leftovers(tmp_path / "models") == []
