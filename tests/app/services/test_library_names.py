"""The library's one name per model: derived from the file (and where it came from), or the
user's, kept in `names.json` next to the library's other records."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.services.library import DEFAULT_MODEL_ID, MAX_NAME, LibraryError, ModelLibrary


def library(models: Path, bundled: Path) -> ModelLibrary:
    return ModelLibrary(models, bundled=bundled, discovery=False)


def test_derived_name_and_slug(tmp_path: Path, smollm2_path: Path) -> None:
    e = library(tmp_path, smollm2_path).entry(DEFAULT_MODEL_ID)
    assert e.facts is not None and e.facts.name == "Smollm2 135M 8k Lc100K Mix1 Ep2"
    assert (e.name, e.derived_name, e.custom_name) == (
        "SmolLM2 135M Instruct · Q4_1",
        "SmolLM2 135M Instruct · Q4_1",
        None,
    )
    assert e.slug == "smollm2-135m-instruct-q4_1"
    d = e.to_dict()
    assert (d["name"], d["general_name"]) == (
        "SmolLM2 135M Instruct · Q4_1",
        "Smollm2 135M 8k Lc100K Mix1 Ep2",
    )


def test_rename_survives_a_restart_and_empty_goes_back(tmp_path: Path, smollm2_path: Path) -> None:
    models = tmp_path / "models"
    lib = library(models, smollm2_path)
    renamed = lib.rename(DEFAULT_MODEL_ID, "  My   little model ")
    assert renamed.name == "My little model" and renamed.custom_name == "My little model"
    assert renamed.slug == "smollm2-135m-instruct-q4_1"  # API clients' id does not change
    stored = json.loads((models / "names.json").read_text("utf-8"))
    assert stored == {str(smollm2_path.resolve()): "My little model"}
    # A new library (the next start) reads it back.
    again = library(models, smollm2_path).entry(DEFAULT_MODEL_ID)
    assert (again.name, again.derived_name) == ("My little model", "SmolLM2 135M Instruct · Q4_1")
    # Empty (or the derived name itself): back to the derived name, nothing stored.
    assert lib.rename(DEFAULT_MODEL_ID, "   ").name == "SmolLM2 135M Instruct · Q4_1"
    assert json.loads((models / "names.json").read_text("utf-8")) == {}
    lib.rename(DEFAULT_MODEL_ID, "x")
    assert lib.rename(DEFAULT_MODEL_ID, "SmolLM2 135M Instruct · Q4_1").custom_name is None


def test_rename_refusals_and_a_broken_names_file(tmp_path: Path, smollm2_path: Path) -> None:
    lib = library(tmp_path, smollm2_path)
    with pytest.raises(LibraryError, match="at most"):
        lib.rename(DEFAULT_MODEL_ID, "x" * (MAX_NAME + 1))
    with pytest.raises(LibraryError, match="no model called"):
        lib.rename("nope", "x")
    (tmp_path / "names.json").write_text("{not json", "utf-8")
    assert lib.entry(DEFAULT_MODEL_ID).name == "SmolLM2 135M Instruct · Q4_1"
    assert lib.rename(DEFAULT_MODEL_ID, "Fine").name == "Fine"  # and it is written anew


def test_each_file_its_own_name_and_delete_forgets_it(tmp_path: Path, smollm2_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    copy = models / "smollm2-135m-instruct-q4_1-copy.gguf"
    shutil.copyfile(smollm2_path, copy)
    lib = library(models, smollm2_path)
    e = lib.entry("smollm2-135m-instruct-q4_1-copy")
    assert e.name == "SmolLM2 135M Instruct Copy · Q4_1"
    lib.rename(e.id, "Spare")
    names = {x.id: x.name for x in lib.entries()}
    assert names == {
        DEFAULT_MODEL_ID: "SmolLM2 135M Instruct · Q4_1",
        "smollm2-135m-instruct-q4_1-copy": "Spare",
    }
    lib.delete(e.id)
    assert json.loads((models / "names.json").read_text("utf-8")) == {}
