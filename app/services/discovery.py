"""Models other tools already keep on disk, found and offered for use without copying them.

- the Hugging Face cache (`models--owner--name/snapshots/<commit>/*.gguf`, links into blobs/)
- LM Studio's models folder (`<root>/<publisher>/<repo>/*.gguf`)
- Ollama's store: `manifests/<registry>/<namespace>/<model>/<tag>` JSON files whose layer of
  media type `application/vnd.ollama.image.model` names a GGUF blob `blobs/sha256-<hex>`.

Nothing here writes to those folders. Each model records which tool owns it so the library
never deletes another tool's file without saying so.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from app.services.hub import shard_info
from app.services.projectors import is_projector_name

HF_CACHE, LM_STUDIO, OLLAMA = "hf-cache", "lm-studio", "ollama"
OWNER_NAMES = {HF_CACHE: "the Hugging Face cache", LM_STUDIO: "LM Studio", OLLAMA: "Ollama"}
OLLAMA_MODEL_MEDIA = "application/vnd.ollama.image.model"
MAX_MANIFEST_BYTES = 1 << 20


@dataclass(frozen=True)
class DiscoveredModel:
    path: Path  # the file to load (for the HF cache, the snapshot link)
    source: str  # hf-cache | lm-studio | ollama
    name: str  # what the other tool calls it: repo/file, publisher/repo/file, model:tag
    size: int

    @property
    def owner(self) -> str:
        return OWNER_NAMES.get(self.source, self.source)


@dataclass(frozen=True)
class DiscoveryRoots:
    hf_cache: Path | None = None
    lm_studio: tuple[Path, ...] = ()
    ollama: tuple[Path, ...] = ()

    @classmethod
    def default(cls) -> DiscoveryRoots:
        """The usual places, honouring HF_HUB_CACHE/HF_HOME and OLLAMA_MODELS."""
        from app.services.hf_cache import hf_hub_cache

        home = Path.home()
        lm = (home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models")
        ollama_env = os.environ.get("OLLAMA_MODELS")
        ollama = (
            (Path(ollama_env),)
            if ollama_env
            else (home / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models"))
        )
        return cls(hf_cache=hf_hub_cache(), lm_studio=lm, ollama=ollama)


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def _is_first_or_single(name: str) -> bool:
    """Shards after the first are loaded by llama.cpp through the first: list only that one."""
    info = shard_info(name)
    return info is None or info[1] == 1


def discover_hf_cache(cache: Path) -> list[DiscoveredModel]:
    out: list[DiscoveredModel] = []
    if not cache.is_dir():
        return out
    for repo_dir in sorted(cache.glob("models--*")):
        repo_id = repo_dir.name[len("models--") :].replace("--", "/")
        seen: set[Path] = set()
        snapshots = sorted(
            (repo_dir / "snapshots").glob("*"), key=lambda p: _mtime(p), reverse=True
        )  # newest commit wins
        for snap in snapshots:
            for f in sorted(snap.rglob("*.gguf")):
                rel = f.relative_to(snap).as_posix()
                if not _is_first_or_single(f.name) or not f.exists():  # dangling link
                    continue
                if is_projector_name(f.name):
                    continue  # paired with the model beside it (app/services/projectors.py)
                target = f.resolve()
                if target in seen:
                    continue
                seen.add(target)
                out.append(DiscoveredModel(f, HF_CACHE, f"{repo_id}/{rel}", _size(f)))
    return out


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def discover_lm_studio(root: Path) -> list[DiscoveredModel]:
    out: list[DiscoveredModel] = []
    if not root.is_dir():
        return out
    for f in sorted(root.rglob("*.gguf")):
        if not f.is_file() or not _is_first_or_single(f.name):
            continue
        rel = f.relative_to(root).as_posix()
        if is_projector_name(f.name):
            continue  # a projector: the library pairs it with the model beside it
        out.append(DiscoveredModel(f, LM_STUDIO, rel, _size(f)))
    return out


def discover_ollama(root: Path) -> list[DiscoveredModel]:
    out: list[DiscoveredModel] = []
    manifests = root / "manifests"
    if not manifests.is_dir():
        return out
    for m in sorted(manifests.rglob("*")):
        if not m.is_file() or m.stat().st_size > MAX_MANIFEST_BYTES:
            continue
        try:
            data = json.loads(m.read_text("utf-8"))
            layers = data["layers"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a manifest we understand; never guess
        digest = next(
            (
                layer.get("digest")
                for layer in layers
                if isinstance(layer, dict) and layer.get("mediaType") == OLLAMA_MODEL_MEDIA
            ),
            None,
        )
        if not isinstance(digest, str) or ":" not in digest:
            continue
        blob = root / "blobs" / digest.replace(":", "-")
        if not blob.is_file():
            continue
        parts = m.relative_to(manifests).parts  # registry, namespace, model, tag
        if len(parts) < 3:
            continue
        model, tag = parts[-2], parts[-1]
        namespace = parts[-3] if len(parts) >= 4 else ""
        registry = parts[0] if len(parts) >= 4 else ""
        name = f"{model}:{tag}"
        if namespace and namespace != "library":
            name = f"{namespace}/{name}"
        if registry and registry != "registry.ollama.ai":
            name = f"{registry}/{name}"
        out.append(DiscoveredModel(blob, OLLAMA, name, _size(blob)))
    return out


def discover(roots: DiscoveryRoots) -> list[DiscoveredModel]:
    """Every model found under `roots`, each file once."""
    found: list[DiscoveredModel] = []
    if roots.hf_cache is not None:
        found += discover_hf_cache(roots.hf_cache)
    for r in roots.lm_studio:
        found += discover_lm_studio(r)
    for r in roots.ollama:
        found += discover_ollama(r)
    return list(_unique(found))


def _unique(models: Iterable[DiscoveredModel]) -> Iterable[DiscoveredModel]:
    seen: set[Path] = set()
    for d in models:
        try:
            key = d.path.resolve()
        except OSError:
            key = d.path
        if key not in seen:
            seen.add(key)
            yield d
