"""The desktop host's catalog: the library's readable models as models the host loads on
demand, found by the names API clients send; the load settings an on-demand model gets."""

from __future__ import annotations

from pathlib import Path

from app.services.library import LibraryEntry, ModelLibrary
from app.services.model_catalog import library_catalog, server_params
from engine.host.host import ModelHost
from engine.host.runtime import Model
from engine.settings import LoadParams

PARAMS = LoadParams(n_ctx=512, n_threads=2)


def library_with(tmp_path: Path, smollm2_path: Path, gemma_path: Path) -> ModelLibrary:
    models = tmp_path / "models"
    models.mkdir()
    (models / "gemma-3-270m.gguf").symlink_to(gemma_path)
    (models / "broken.gguf").write_bytes(b"not a gguf file")
    return ModelLibrary(models, bundled=smollm2_path, discovery=False)


def test_library_models_resolve_by_id_slug_and_file(
    tmp_path: Path, smollm2_path: Path, gemma_path: Path
) -> None:
    library = library_with(tmp_path, smollm2_path, gemma_path)
    entries = {e.path.name: e for e in library.entries()}
    assert entries["broken.gguf"].error is not None
    asked: list[str] = []

    def params(e: LibraryEntry) -> LoadParams:
        asked.append(e.id)
        return PARAMS

    specs = library_catalog(library, params)()
    assert sorted(s.path.name for s in specs) == sorted(
        [smollm2_path.name, "gemma-3-270m.gguf"]
    )  # the unreadable file is left out
    host = ModelHost(lambda: specs)
    try:
        for e in (entries[smollm2_path.name], entries["gemma-3-270m.gguf"]):
            spec = next(s for s in specs if s.path == e.path)
            assert (spec.name, spec.aliases, spec.title, spec.params) == (
                e.id,
                (e.slug,),
                e.name,
                PARAMS,
            )
            for asked_as in (e.id, e.slug, e.slug.upper(), e.path.name, e.path.stem):
                assert host.resolve(asked_as) == e.id
        assert sorted(asked) == sorted(s.name for s in specs)
        assert host.loads == 0  # resolving loads nothing
    finally:
        host.close()


def test_a_file_the_chat_loaded_is_found_not_loaded_again(
    tmp_path: Path, smollm2_path: Path, gemma_path: Path
) -> None:
    library = library_with(tmp_path, smollm2_path, gemma_path)
    smol = next(e for e in library.entries() if e.path == smollm2_path)
    host: ModelHost
    host = ModelHost(library_catalog(library, lambda e: PARAMS, loaded=lambda: host.hosted()))
    model = Model(smollm2_path, PARAMS)
    try:
        host.add("the-chats-name", model)  # as the engine thread adds the chat's model
        with host.acquire(smol.id) as lease:
            assert lease.model is model
        assert host.resolve(smol.slug) == "the-chats-name"
        assert host.loads == 0
    finally:
        host.remove("the-chats-name")
        model.close()
        host.close()


def test_server_params_use_the_slots_and_the_saved_placement() -> None:
    assert server_params(4, 4096) == LoadParams(n_ctx=16384, n_seq_max=4)
    saved = {
        "n_ctx": 999,
        "gpu_layers": 0,
        "type_k": "q8_0",
        "type_v": "q8_0",
        "flash_attn": "on",
        "speculative": "draft",
        "draft_model": "/x.gguf",
    }
    p = server_params(2, 1024, saved)
    # The chat's context and its draft model are not the API's.
    assert (p.n_ctx, p.n_seq_max, p.speculative) == (2048, 2, None)
    assert (p.n_gpu_layers, p.type_k, p.type_v, p.flash_attn) == (0, "q8_0", "q8_0", "on")
    # Unknown values are skipped; a combination llama.cpp refuses falls back to the defaults.
    assert server_params(1, 512, {"gpu_layers": -3, "type_k": "q9"}) == LoadParams(n_ctx=512)
    assert server_params(1, 512, {"type_v": "q8_0", "flash_attn": "off"}) == LoadParams(n_ctx=512)
