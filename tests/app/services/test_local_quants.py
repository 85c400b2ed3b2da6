"""Where a quant made locally goes by default, without making one (tests/app/test_quantize_cli.py
makes real ones)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.services import local_quants
from app.services.library import LibraryEntry, ModelLibrary
from engine.model.quant_types import QuantizeError, parse_quant_type


@pytest.fixture
def lib(tmp_path: Path) -> ModelLibrary:
    return ModelLibrary(tmp_path / "models", bundled=False, discovery=False)


def _entry(path: Path, source: str, *, linked: bool = False) -> LibraryEntry:
    path.parent.mkdir(parents=True, exist_ok=True)
    return LibraryEntry(path.stem, path, source, linked=linked)


def test_a_user_s_file_gets_its_quant_beside_it(lib: ModelLibrary, tmp_path: Path) -> None:
    src = tmp_path / "mine" / "Qwen2.5-0.5B-Instruct-F16.gguf"
    q = parse_quant_type("q4_k_m")
    for entry in (None, _entry(src, "imported", linked=True), _entry(src, "imported")):
        assert local_quants.default_output(lib, src, q, entry) == (
            tmp_path / "mine" / "Qwen2.5-0.5B-Instruct-Q4_K_M.gguf"
        )


@pytest.mark.parametrize("source", ["bundled", "downloaded", "hf-cache", "lm-studio", "ollama"])
def test_the_bundled_model_downloads_and_other_tools_files_quantize_into_the_library(
    lib: ModelLibrary, tmp_path: Path, source: str
) -> None:
    src = tmp_path / "elsewhere" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    out = local_quants.default_output(lib, src, parse_quant_type("Q4_0"), _entry(src, source))
    assert out == lib.models_dir / "SmolLM2-135M-Instruct-Q4_0.gguf"


def test_a_folder_that_cannot_be_written_sends_it_to_the_library(
    lib: ModelLibrary, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "ro" / "m-F16.gguf"
    src.parent.mkdir()
    # a read-only folder cannot be made for a test running as root
    monkeypatch.setattr(local_quants, "writable", lambda folder: folder != src.parent)
    assert local_quants.output_folder(lib, src, None) == lib.models_dir


def test_a_bad_type_or_model_is_refused_before_anything_runs(
    lib: ModelLibrary, tmp_path: Path
) -> None:
    with pytest.raises(QuantizeError, match="unknown quantization type 'Q3'"):
        local_quants.quantize_model(lib, "anything", "Q3")
    with pytest.raises(LookupError, match="no model called 'nothing'"):
        local_quants.quantize_model(lib, "nothing", "Q4_0")
    not_gguf = tmp_path / "notes-F16.gguf"
    not_gguf.write_text("just text")
    with pytest.raises(QuantizeError, match="not a GGUF model"):
        local_quants.quantize_model(lib, str(not_gguf), "Q4_0")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes-F16.gguf"]
