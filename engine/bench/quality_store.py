"""The reference's scores of a text, kept on disk so that comparing another quant later costs
one pass (the candidate's), as llama.cpp's `--kl-divergence-base` file does.

One compressed numpy archive (`.npz`) per (reference file, text, context, batch, chunks): the
text's tokens, and per scored position the reference's top token, its negative
log-likelihood of the next token and its log-probabilities above `KLD_FLOOR` (sparse, row by
row: `indptr` into `cols`/`logp`). The key names the file by its resolved path, size and
modification time, so a changed file is scored again. Written to a temporary name and
renamed: a file under its real name is always whole.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from engine.errors import EngineError
from engine.files import atomic_file

# Bumped when what a file holds, or how it is computed, changes: older files are ignored.
FORMAT = 1


@dataclass(frozen=True)
class ReferenceKey:
    """What a reference's scores depend on."""

    path: str  # resolved
    size_bytes: int
    mtime_ns: int
    text_sha256: str
    ctx: int
    n_batch: int
    chunks: int

    @classmethod
    def of(cls, path: Path, text_sha256: str, ctx: int, n_batch: int, chunks: int) -> ReferenceKey:
        st = path.stat()
        return cls(
            str(path.resolve()), st.st_size, st.st_mtime_ns, text_sha256, ctx, n_batch, chunks
        )

    def digest(self) -> str:
        blob = json.dumps({"format": FORMAT, **self.__dict__}, sort_keys=True)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:32]


@dataclass
class ReferenceScores:
    """The reference pass over a text: everything a candidate is compared with."""

    tokens: npt.NDArray[np.int32]  # the text's scored chunks, BOS not substituted
    top: npt.NDArray[np.int32]  # per scored position
    nll: npt.NDArray[np.float64]
    indptr: npt.NDArray[np.int64]  # rows + 1
    cols: npt.NDArray[np.int32]
    logp: npt.NDArray[np.float32]
    n_vocab: int
    pass_s: float  # how long the pass took (decode and arithmetic)

    @property
    def rows(self) -> int:
        return int(self.top.size)

    def block(self, start: int, stop: int) -> tuple[npt.NDArray[np.int32], slice]:
        """Rows [start, stop): each kept value's row within the block, and its span in
        `cols`/`logp`."""
        lo, hi = int(self.indptr[start]), int(self.indptr[stop])
        counts = np.diff(self.indptr[start : stop + 1])
        rows = np.repeat(np.arange(stop - start, dtype=np.int32), counts)
        return rows, slice(lo, hi)


def cache_path(folder: Path, key: ReferenceKey) -> Path:
    return folder / f"reference-{key.digest()}.npz"


def save(path: Path, scores: ReferenceScores, key: ReferenceKey) -> None:
    """Write `scores` whole under `path` (compressed), or leave nothing there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "format": FORMAT,
        "key": key.__dict__,
        "n_vocab": scores.n_vocab,
        "pass_s": scores.pass_s,
    }
    with atomic_file(path) as f:
        np.savez_compressed(
            f,
            meta=np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8),
            tokens=scores.tokens,
            top=scores.top,
            nll=scores.nll,
            indptr=scores.indptr,
            cols=scores.cols,
            logp=scores.logp,
        )


def load(path: Path, key: ReferenceKey) -> ReferenceScores | None:
    """The scores kept for `key`, or None when there are none (or they are unreadable, of
    another format or for another key: they are then computed again)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            meta: dict[str, Any] = json.loads(bytes(z["meta"]).decode("utf-8"))
            if meta.get("format") != FORMAT or meta.get("key") != key.__dict__:
                return None
            scores = ReferenceScores(
                tokens=z["tokens"].astype(np.int32),
                top=z["top"].astype(np.int32),
                nll=z["nll"].astype(np.float64),
                indptr=z["indptr"].astype(np.int64),
                cols=z["cols"].astype(np.int32),
                logp=z["logp"].astype(np.float32),
                n_vocab=int(meta["n_vocab"]),
                pass_s=float(meta["pass_s"]),
            )
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, EOFError):
        return None
    n = scores.rows
    if (
        scores.nll.size != n
        or scores.indptr.size != n + 1
        or int(scores.indptr[-1]) != scores.cols.size
        or scores.cols.size != scores.logp.size
    ):
        return None
    return scores


class StoreError(EngineError):
    """The reference's scores cannot be kept."""


__all__ = ["FORMAT", "ReferenceKey", "ReferenceScores", "StoreError", "cache_path", "load", "save"]
