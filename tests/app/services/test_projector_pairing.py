"""A model is paired with the projector (mmproj) beside it: the library lists the pair as one
model that reads images or audio, importing takes the projector along, and loads pass it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from app.services.discovery import DiscoveryRoots, discover_lm_studio
from app.services.library import LibraryError, ModelLibrary
from app.services.model_catalog import library_catalog, server_params
from app.services.projectors import choose_projector, pair


def test_the_projector_matching_the_models_precision_is_chosen() -> None:
    names = ["mmproj-model-Q8_0.gguf", "mmproj-model-f16.gguf", "mmproj-model-bf16.gguf"]
    files = [Path(n) for n in names]
    assert choose_projector(Path("model-Q8_0.gguf"), files) == Path("mmproj-model-Q8_0.gguf")
    assert choose_projector(Path("model-Q4_K_M.gguf"), files) == Path("mmproj-model-f16.gguf")
    assert choose_projector(Path("model.gguf"), files) == Path("mmproj-model-f16.gguf")
    assert choose_projector(Path("model.gguf"), [Path("mmproj-b.gguf"), Path("mmproj-a.gguf")]) == (
        Path("mmproj-a.gguf")
    )
    assert choose_projector(Path("model.gguf"), [Path("other.gguf")]) is None


def _folder(tmp: Path, model: Path, *projectors: Path) -> Path:
    folder = tmp / "SmolVLM"
    folder.mkdir()
    (folder / "SmolLM2-135M-Instruct-Q8_0.gguf").symlink_to(model)
    for p in projectors:
        shutil.copyfile(p, folder / p.name)
    return folder


def test_a_linked_import_pairs_the_model_with_its_projector(
    tmp_path: Path, smollm2_path: Path, vision_projector_path: Path
) -> None:
    folder = _folder(tmp_path, smollm2_path, vision_projector_path)
    lib = ModelLibrary(tmp_path / "models", bundled=False, discovery=False)
    (entry,) = lib.import_folder(folder)
    assert entry.path == smollm2_path.resolve()  # a link records the file itself
    assert entry.projector is not None and entry.projector.error is None
    assert entry.capabilities == ("vision",)
    assert entry.mmproj == str(folder / vision_projector_path.name)
    # One entry: the projector is not a model of its own.
    assert [e.id for e in lib.entries()] == [entry.id]
    assert entry.to_dict()["capabilities"] == ["vision"]
    with pytest.raises(LibraryError, match="projector"):
        lib.import_file(folder / vision_projector_path.name)
    with pytest.raises(LibraryError, match="no model to import"):
        lib.import_folder(folder)  # already there


def test_a_copied_import_takes_the_projector_into_its_own_folder(
    tmp_path: Path, smollm2_path: Path, audio_projector_path: Path
) -> None:
    folder = _folder(tmp_path, smollm2_path, audio_projector_path)
    lib = ModelLibrary(tmp_path / "models", bundled=False, discovery=False)
    (entry,) = lib.import_folder(folder, mode="copy")
    assert entry.path.parent != tmp_path / "models"  # a folder of its own
    assert (entry.path.parent / audio_projector_path.name).is_file()
    assert entry.capabilities == ("audio",)
    assert [e.path for e in lib.entries()] == [entry.path]


def test_a_broken_projector_is_shown_with_its_reason(tmp_path: Path, smollm2_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    model = folder / "model.gguf"
    model.symlink_to(smollm2_path)
    (folder / "mmproj-model-f16.gguf").write_bytes(b"GGUF" + b"\0" * 20)
    info = pair(model)
    assert info is not None and info.error and info.capabilities == ()
    lib = ModelLibrary(tmp_path / "models", bundled=False, discovery=False)
    (entry,) = lib.import_folder(folder)
    assert entry.mmproj is None  # not passed to a load: the load would fail on it


def test_discovered_models_pair_and_loads_by_name_pass_the_projector(
    tmp_path: Path, smollm2_path: Path, vision_projector_path: Path
) -> None:
    root = tmp_path / "lmstudio"
    repo = root / "someone" / "SmolVLM"
    repo.mkdir(parents=True)
    (repo / "SmolVLM-Q8_0.gguf").symlink_to(smollm2_path)
    shutil.copyfile(vision_projector_path, repo / "mmproj-SmolVLM-f16.gguf")
    assert [d.path.name for d in discover_lm_studio(root)] == ["SmolVLM-Q8_0.gguf"]
    lib = ModelLibrary(
        tmp_path / "models", bundled=False, discovery=DiscoveryRoots(lm_studio=(root,))
    )
    (entry,) = lib.entries()
    assert entry.capabilities == ("vision",)
    (spec,) = library_catalog(lib, lambda e: server_params(1, 512))()
    assert spec.params.mmproj == str(repo / "mmproj-SmolVLM-f16.gguf")


def test_a_projector_pairs_only_with_the_models_it_fits(
    tmp_path: Path, smollm2_path: Path, minilm_path: Path, vision_projector_path: Path
) -> None:
    """A folder of several models beside one projector: its output width (576) is
    SmolLM2's, not MiniLM's (an embedding model, which never gets one anyway)."""
    folder = _folder(tmp_path, smollm2_path, vision_projector_path)
    (folder / "all-MiniLM-L6-v2.gguf").symlink_to(minilm_path)
    lib = ModelLibrary(tmp_path / "models", bundled=False, discovery=False)
    entries = {e.path.name: e for e in lib.import_folder(folder)}
    assert entries[minilm_path.resolve().name].projector is None
    assert entries[smollm2_path.resolve().name].capabilities == ("vision",)
