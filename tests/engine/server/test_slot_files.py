"""Slot files (engine.server.slot_files): what is written reads back whole; a file that is cut,
padded, foreign or from another model or context is refused in one line; names stay inside
the slot folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.files import write_bytes_atomic
from engine.server.slot_files import (
    MAGIC,
    SlotFileError,
    SlotIdentity,
    check_identity,
    decode,
    encode,
    slot_path,
)

HERE = SlotIdentity(model="m", model_digest="d" * 64, n_ctx_seq=1024, type_k="f16", type_v="f16")
TOKENS = [1, 2, 3, 50_000, 0]
STATE = bytes(range(256)) * 3


def test_a_written_file_reads_back_whole(tmp_path: Path) -> None:
    path = tmp_path / "a.bin"
    write_bytes_atomic(path, encode(HERE, TOKENS, STATE))
    got = decode(path.read_bytes(), "a.bin")
    assert (got.identity, got.tokens, got.state) == (HERE, TOKENS, STATE)
    assert [p.name for p in tmp_path.iterdir()] == ["a.bin"]  # no temporary file left
    empty = decode(encode(HERE, [], b""), "e")
    assert (empty.tokens, empty.state) == ([], b"")


@pytest.mark.parametrize(
    ("cut", "says"),
    [
        (lambda d: d[:-1], "is truncated or has trailing bytes"),
        (lambda d: d + b"x", "is truncated or has trailing bytes"),
        (lambda d: d[: len(MAGIC) + 10], "its header is cut short"),
        (lambda d: b"GGUF" + d[4:], "is not a slot file of this server"),
        (lambda d: b"", "is not a slot file of this server"),
        (lambda d: d[: len(MAGIC) + 4] + b"[" + d[len(MAGIC) + 5 :], "header is unreadable"),
    ],
)
def test_a_damaged_file_is_one_line(cut: object, says: str) -> None:
    data = encode(HERE, TOKENS, STATE)
    with pytest.raises(SlotFileError) as e:
        decode(cut(data), "f.bin")  # type: ignore[operator]
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_header_of_the_wrong_version_or_fields_is_refused() -> None:
    data = encode(HERE, TOKENS, STATE)
    n = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 4], "little")
    head = data[len(MAGIC) + 4 : len(MAGIC) + 4 + n]
    for new in (head.replace(b'"version":1', b'"version":9'), head.replace(b'"model"', b'"x"')):
        rebuilt = MAGIC + len(new).to_bytes(4, "little") + new + data[len(MAGIC) + 4 + n :]
        with pytest.raises(SlotFileError):
            decode(rebuilt, "f")


@pytest.mark.parametrize(
    ("saved", "says"),
    [
        (HERE.model_copy(update={"model_digest": "e" * 64}), "another model file"),
        (HERE.model_copy(update={"n_ctx_seq": 2048}), "2048 tokens per slot"),
        (HERE.model_copy(update={"type_k": "q8_0"}), "q8_0/f16 KV cache"),
    ],
)
def test_a_state_of_another_model_or_context_is_refused(saved: SlotIdentity, says: str) -> None:
    with pytest.raises(SlotFileError, match=says):
        check_identity(saved, HERE, "f")
    check_identity(HERE.model_copy(update={"model": "renamed"}), HERE, "f")  # a name is no matter


def test_names_stay_inside_the_folder(tmp_path: Path) -> None:
    assert slot_path(tmp_path, "chat-1.bin") == tmp_path.resolve() / "chat-1.bin"
    outside = tmp_path.parent / "outside.bin"
    (tmp_path / "link.bin").symlink_to(outside)
    for bad in ("", ".", "..", "../x", "a/b", "/etc/passwd", "a\\b", " x", "x\n", "c:x"):
        with pytest.raises(SlotFileError, match="invalid filename"):
            slot_path(tmp_path, bad)
    with pytest.raises(SlotFileError, match="outside the slot folder"):
        slot_path(tmp_path, "link.bin")
    with pytest.raises(SlotFileError):
        slot_path(tmp_path, "x" * 256)


def test_a_failed_write_leaves_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.bin"
    write_bytes_atomic(path, b"old")

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_bytes_atomic(path, b"new")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.bin"]  # the part file is gone
