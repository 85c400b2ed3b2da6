"""A slot's prompt state in a file: what `/slots/{id}?action=save` writes and `restore` reads.

llama-server writes llama.cpp's sequence-state file (`llama_state_seq_save_file`: the tokens,
then the KV cells), which does not say which model or context it came from; restored into
another model it is refused only when the cells' shapes differ, and silently wrong when they
match. This file says it: a fixed magic, one JSON header (the model file's identity, the KV
types and the slot's context), the tokens as little-endian int32, then the state llama.cpp
gave (`llama_state_seq_get_data`). The header is checked (pydantic) before anything is read
into the context, and every problem is one line.

Files are written whole or not at all (a temporary file in the same folder, flushed to the disk,
renamed over the name). Names are plain file names inside the server's `--slot-save-path`
folder; one that would resolve outside it (a path, `..`, a link out) is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.errors import EngineError

MAGIC = b"CANDLEWICK-SLOT\x00"
VERSION = 1
MAX_HEADER = 1 << 16
MAX_NAME_BYTES = 255
_FORBIDDEN = frozenset('/\\:*?"<>|')


class SlotFileError(EngineError):
    """A slot file that cannot be used here; `str()` is one line for the client."""


class SlotIdentity(BaseModel):
    """What a saved state belongs to: a state restores only where all of it is the same."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, protected_namespaces=())

    model: str  # the model's name on the server that saved it (shown, not compared)
    model_digest: str  # engine.server.engine_state.file_digest of its GGUF
    n_ctx_seq: int = Field(ge=1)
    type_k: str
    type_v: str


class SlotHeader(SlotIdentity):
    version: int
    n_tokens: int = Field(ge=0)
    state_bytes: int = Field(ge=0)


@dataclass(frozen=True)
class SlotFile:
    identity: SlotIdentity
    tokens: list[int]
    state: bytes


def slot_path(folder: Path, filename: str) -> Path:
    """`filename` inside `folder`; SlotFileError for anything but a plain file name there."""
    if (
        not filename
        or len(filename.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES
        or filename in (".", "..")
        or filename != filename.strip()
        or any(c in _FORBIDDEN or not c.isprintable() for c in filename)
    ):
        raise SlotFileError(f"invalid filename {filename!r}: give a plain file name")
    root = folder.resolve()
    path = (root / filename).resolve()
    if path.parent != root:
        raise SlotFileError(f"invalid filename {filename!r}: it resolves outside the slot folder")
    return path


def encode(identity: SlotIdentity, tokens: list[int], state: bytes) -> bytes:
    header = SlotHeader(
        **identity.model_dump(), version=VERSION, n_tokens=len(tokens), state_bytes=len(state)
    )
    head = header.model_dump_json().encode()
    body = np.asarray(tokens, dtype="<i4").tobytes()
    return b"".join((MAGIC, len(head).to_bytes(4, "little"), head, body, state))


def decode(data: bytes, name: str) -> SlotFile:
    """A file's content checked whole; SlotFileError names what is wrong."""
    bad = f"{name} is not a slot file of this server"
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 4:
        raise SlotFileError(bad)
    at = len(MAGIC) + 4
    n_head = int.from_bytes(data[len(MAGIC) : at], "little")
    if n_head > MAX_HEADER or at + n_head > len(data):
        raise SlotFileError(f"{bad} (its header is cut short)")
    try:
        header = SlotHeader.model_validate(json.loads(data[at : at + n_head]))
    except (ValueError, ValidationError):
        raise SlotFileError(f"{bad} (its header is unreadable)") from None
    if header.version != VERSION:
        raise SlotFileError(f"{name} is a slot file of version {header.version}, not {VERSION}")
    at += n_head
    end = at + 4 * header.n_tokens
    if end + header.state_bytes != len(data):
        raise SlotFileError(f"{name} is truncated or has trailing bytes")
    tokens = np.frombuffer(data[at:end], dtype="<i4").tolist()
    identity = SlotIdentity(**header.model_dump(exclude={"version", "n_tokens", "state_bytes"}))
    return SlotFile(identity, tokens, data[end:])


def check_identity(saved: SlotIdentity, here: SlotIdentity, name: str) -> None:
    """SlotFileError unless a state saved as `saved` can be restored `here`."""
    if saved.model_digest != here.model_digest:
        raise SlotFileError(
            f"{name} was saved from another model file ({saved.model!r}); this is {here.model!r}"
        )
    if saved.n_ctx_seq != here.n_ctx_seq:
        raise SlotFileError(
            f"{name} was saved with {saved.n_ctx_seq} tokens per slot; this server has "
            f"{here.n_ctx_seq}"
        )
    if (saved.type_k, saved.type_v) != (here.type_k, here.type_v):
        raise SlotFileError(
            f"{name} holds a {saved.type_k}/{saved.type_v} KV cache; this one is "
            f"{here.type_k}/{here.type_v}"
        )


__all__ = [
    "SlotFile",
    "SlotFileError",
    "SlotHeader",
    "SlotIdentity",
    "check_identity",
    "decode",
    "encode",
    "slot_path",
]
