"""Models of other tools found in place, and the library's import and delete."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.services.discovery import (
    DiscoveryRoots,
    discover,
    discover_hf_cache,
    discover_lm_studio,
    discover_ollama,
)
from app.services.library import LibraryError, ModelLibrary
from engine.model.gguf import GGUFError
from tests.hub_emulator import file_sha256, tiny_gguf


def make_hf_cache(root: Path, gguf: Path, repo: str = "Qwen/Qwen2-GGUF") -> Path:
    """The layout huggingface_hub writes: blobs named by hash, snapshot links to them."""
    folder = root / ("models--" + repo.replace("/", "--"))
    sha = file_sha256(gguf)
    (folder / "blobs").mkdir(parents=True)
    (folder / "blobs" / sha).write_bytes(gguf.read_bytes())
    snap = folder / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (snap / "qwen2-q4_0.gguf").symlink_to(f"../../blobs/{sha}")
    (snap / "qwen2-q8_0-00001-of-00002.gguf").symlink_to(f"../../blobs/{sha}")
    (snap / "qwen2-q8_0-00002-of-00002.gguf").symlink_to("../../blobs/missing")
    (snap / "gone.gguf").symlink_to("../../blobs/deadbeef")  # dangling: never listed
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("a" * 40)
    return snap / "qwen2-q4_0.gguf"


def make_lm_studio(root: Path) -> Path:
    model = tiny_gguf(root / "lmstudio-community" / "Tiny-GGUF" / "Tiny-Q8_0.gguf", "tiny-lms")
    tiny_gguf(root / "lmstudio-community" / "Tiny-GGUF" / "mmproj-Tiny-F16.gguf", "proj")
    return model


def make_ollama(root: Path, gguf: Path) -> Path:
    digest = file_sha256(gguf)
    blob = root / "blobs" / f"sha256-{digest}"
    blob.parent.mkdir(parents=True)
    blob.write_bytes(gguf.read_bytes())
    (root / "blobs" / "sha256-0000").write_text('{"template": "{{ .Prompt }}"}')
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / "tinyllama" / "latest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(
        json.dumps(
            {
                "schemaVersion": 2,
                "layers": [
                    {
                        "mediaType": "application/vnd.ollama.image.model",
                        "digest": f"sha256:{digest}",
                        "size": gguf.stat().st_size,
                    },
                    {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:0000"},
                ],
            }
        )
    )
    junk = root / "manifests" / "registry.ollama.ai" / "library" / "broken" / "latest"
    junk.parent.mkdir(parents=True)
    junk.write_text("not json")
    return blob


@pytest.fixture
def roots(tmp_path: Path) -> DiscoveryRoots:
    src = tiny_gguf(tmp_path / "src" / "base.gguf", "qwen-tiny")
    make_hf_cache(tmp_path / "hf" / "hub", src)
    make_lm_studio(tmp_path / "lms")
    make_ollama(tmp_path / "ollama", tiny_gguf(tmp_path / "src" / "o.gguf", "ollama-tiny", 32))
    return DiscoveryRoots(tmp_path / "hf" / "hub", (tmp_path / "lms",), (tmp_path / "ollama",))


def test_hf_cache_layout(roots: DiscoveryRoots) -> None:
    assert roots.hf_cache is not None
    found = discover_hf_cache(roots.hf_cache)
    # Both names point at one blob: listed once; second shards and dangling links are not.
    assert [d.name for d in found] == ["Qwen/Qwen2-GGUF/qwen2-q4_0.gguf"]
    assert found[0].source == "hf-cache" and found[0].size > 0


def test_lm_studio_layout(roots: DiscoveryRoots) -> None:
    found = discover_lm_studio(roots.lm_studio[0])
    assert [d.name for d in found] == ["lmstudio-community/Tiny-GGUF/Tiny-Q8_0.gguf"]


def test_ollama_manifests_point_at_gguf_blobs(roots: DiscoveryRoots) -> None:
    found = discover_ollama(roots.ollama[0])
    assert [d.name for d in found] == ["tinyllama:latest"]
    assert found[0].path.name.startswith("sha256-")
    assert found[0].path.read_bytes()[:4] == b"GGUF"


def test_missing_roots_find_nothing(tmp_path: Path) -> None:
    assert discover(DiscoveryRoots(tmp_path / "no", (tmp_path / "no",), (tmp_path / "no",))) == []


def test_library_offers_discovered_models_in_place(roots: DiscoveryRoots, tmp_path: Path) -> None:
    lib = ModelLibrary(tmp_path / "models", bundled=False, discovery=roots)
    by_source = {e.source: e for e in lib.entries()}
    assert set(by_source) == {"hf-cache", "lm-studio", "ollama"}
    assert all(e.facts is not None for e in by_source.values())  # headers read, usable
    assert by_source["ollama"].id == "tinyllama-latest"
    assert by_source["ollama"].facts.name == "ollama-tiny"  # type: ignore[union-attr]
    assert lib.resolve("tinyllama-latest") == by_source["ollama"].path
    assert by_source["lm-studio"].owner == "LM Studio"
    d = by_source["hf-cache"].to_dict()
    assert d["owner"] == "the Hugging Face cache" and d["label"].startswith("Qwen/")


def test_deleting_another_tools_file_needs_saying_so(roots: DiscoveryRoots, tmp_path: Path) -> None:
    lib = ModelLibrary(tmp_path / "models", bundled=False, discovery=roots)
    ids = {e.source: e.id for e in lib.entries()}
    with pytest.raises(LibraryError, match="ollama rm tinyllama:latest"):
        lib.plan_delete(ids["ollama"])
    plan = lib.plan_delete(ids["lm-studio"])
    assert plan.owner == "LM Studio" and "LM Studio" in (plan.warning or "")
    with pytest.raises(LibraryError, match="belongs to LM Studio"):
        lib.delete(ids["lm-studio"])
    path = plan.entry.path
    assert path.exists()
    done = lib.delete(ids["lm-studio"], allow_foreign=True)
    assert not path.exists() and done.freed_bytes == plan.freed_bytes > 0
    # An HF cache file whose blob another snapshot name still uses: only the link goes.
    hf = lib.plan_delete(ids["hf-cache"])
    assert len(hf.files) == 1 and hf.freed_bytes == 0
    lib.delete(ids["hf-cache"], allow_foreign=True)
    left = [e for e in lib.entries() if e.source == "hf-cache"]
    assert [e.label for e in left] == ["Qwen/Qwen2-GGUF/qwen2-q8_0-00001-of-00002.gguf"]
    # The last link of that blob: the blob goes too, with the split model's (dangling) second
    # part; a link that is no part of it stays.
    last = lib.plan_delete(left[0].id)
    assert [p.name for p in last.files][::2] == [
        "qwen2-q8_0-00001-of-00002.gguf",
        "qwen2-q8_0-00002-of-00002.gguf",
    ]
    assert len(last.files) == 3 and last.freed_bytes > 0
    lib.delete(left[0].id, allow_foreign=True)
    assert roots.hf_cache is not None
    folder = roots.hf_cache / "models--Qwen--Qwen2-GGUF"
    assert list((folder / "blobs").iterdir()) == []
    assert [p.name for p in (folder / "snapshots").rglob("*.gguf")] == ["gone.gguf"]


def test_bundled_model_cannot_be_deleted(tmp_path: Path, smollm2_path: Path) -> None:
    lib = ModelLibrary(tmp_path / "models", discovery=False)
    with pytest.raises(LibraryError, match="cannot be deleted"):
        lib.plan_delete("default")
    assert smollm2_path.exists()


def test_import_link_and_copy_then_delete(tmp_path: Path) -> None:
    lib = ModelLibrary(tmp_path / "models", bundled=False, discovery=False)
    src = tiny_gguf(tmp_path / "elsewhere" / "My-Model-Q4_0.gguf", "mine")
    linked = lib.import_file(src, mode="link")
    assert linked.id == "my-model-q4_0" and linked.linked and linked.source == "imported"
    assert lib.resolve(linked.id) == src.resolve()
    with pytest.raises(LibraryError, match="already in the library"):
        lib.import_file(src, mode="copy")
    plan = lib.delete(linked.id)
    assert plan.freed_bytes == 0 and "stays at" in (plan.warning or "")
    assert src.exists()  # a linked file is never deleted
    assert lib.entries() == []

    copied = lib.import_file(src, mode="copy")
    assert (
        copied.path.parent == tmp_path / "models" and copied.path.read_bytes() == src.read_bytes()
    )
    assert not list((tmp_path / "models").glob("*.incomplete"))
    done = lib.delete(copied.id)
    assert done.freed_bytes == src.stat().st_size and not copied.path.exists()
    assert src.exists()


def test_import_refuses_bad_files_and_full_disks(tmp_path: Path) -> None:
    lib = ModelLibrary(
        tmp_path / "models", bundled=False, discovery=False, free_space=lambda p: 1000
    )
    bad = tmp_path / "notes.gguf"
    bad.write_text("hello, not a model")
    with pytest.raises(GGUFError):
        lib.import_file(bad)
    with pytest.raises(LibraryError, match="no such file"):
        lib.import_file(tmp_path / "missing.gguf")
    good = tiny_gguf(tmp_path / "ok.gguf")
    with pytest.raises(LibraryError, match="not enough disk space"):
        lib.import_file(good, mode="copy")
    assert lib.entries() == []


def test_split_model_imports_and_deletes_as_one(tmp_path: Path) -> None:
    src = tmp_path / "dl"
    first = tiny_gguf(src / "Big-Q4_0-00001-of-00002.gguf", "big", shard=0, split_count=2)
    second = tiny_gguf(src / "Big-Q4_0-00002-of-00002.gguf", "big", shard=1, split_count=2)
    lib = ModelLibrary(tmp_path / "models", bundled=False, discovery=False)
    with pytest.raises(LibraryError, match="import its first part"):
        lib.import_file(second)
    entry = lib.import_file(first, mode="copy")
    copied = sorted(p.name for p in entry.path.parent.iterdir())
    assert copied == [first.name, second.name]  # parts keep their names, side by side
    assert [e.id for e in lib.entries()] == [entry.id]  # listed once, by its first part
    plan = lib.plan_delete(entry.id)
    assert len(plan.files) == 2
    assert plan.freed_bytes == first.stat().st_size + second.stat().st_size
    lib.delete(entry.id)
    assert not list(entry.path.parent.glob("*.gguf"))
    second.unlink()
    with pytest.raises(LibraryError, match="is missing next to it"):
        lib.import_file(first)
