"""`candlewick docs add|index|search|list|remove` in-process, in a private home: with the real
MiniLM over a few short language reference topics, and keyword search over an index written
directly (no model)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.cli import main
from app.services.default_embedding import FILE_NAME
from app.services.documents import index_path
from app.services.embedding_models import LoadedEmbedding
from app.services.paths import AppPaths
from engine.rag.store import RagStore
from tests.app.cli_errors import one_line_error
from tests.engine.rag.helpers import (
    DIM,
    NOTES,
    SALAD,
    bow_vector,
    found,
    make_chunks,
    topic_files,
)

N_TOPICS = 6
# A file of a folder added later: the Python reference's words on `pass`, as a user's own note.
TOPICS_TEXT_EXTRA = "A pass statement is a null operation: nothing happens when it executes.\n"


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["docs", *args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.slow
def test_add_index_search_reindex_list_remove(
    tmp_path: Path, minilm_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = tmp_path / "docs"
    files = topic_files(docs, N_TOPICS)
    (docs / "photo.xyz").write_bytes(b"\x00\x01")
    rc, out, _ = cli(capsys, "add", "ref", str(docs), "--embedding-model", str(minilm_path))
    assert rc == 0 and "Created collection 'ref'" in out

    rc, out, err = cli(capsys, "index", "ref", "--json")
    assert rc == 0, err
    report = json.loads(out)
    assert (report["added"], report["updated"], report["unchanged"], report["removed"]) == (
        N_TOPICS,
        0,
        0,
        0,
    )
    assert report["skipped"] == [
        {"path": str((docs / "photo.xyz").resolve()), "reason": "not a supported format"}
    ]
    assert report["chunks"] >= N_TOPICS and not report["cancelled"]
    assert f"indexing: {N_TOPICS}/{N_TOPICS} files" in err  # progress on stderr

    rc, out, _ = cli(capsys, "index", "ref")
    assert rc == 0
    assert f"0 added, 0 updated, {N_TOPICS} unchanged, 0 removed, 1 skipped; 0 chunks" in out
    assert "skipped " in out and "not a supported format" in out

    question = "Which statement does nothing at all when it is executed?"
    rc, out, _ = cli(capsys, "search", "ref", question, "-k", "3", "--json")
    assert rc == 0
    hits = json.loads(out)
    assert len(hits) == 3 and hits[0]["path"] == str(files["pass"])
    rc, out, _ = cli(capsys, "search", "ref", question)
    assert rc == 0 and out.startswith(f"1. {files['pass']}  [0:")
    assert "score" in out and 'The "pass" statement' in out
    rc, out, _ = cli(capsys, "search", "ref", question, "--mode", "vector", "--json")
    assert rc == 0 and len(json.loads(out)) == 5

    rc, out, _ = cli(capsys, "list", "--json")
    [listed] = json.loads(out)
    assert listed["name"] == "ref" and listed["roots"] == [str(docs.resolve())]
    assert (listed["files"], listed["skipped"]) == (N_TOPICS, 1)
    assert listed["chunks"] == report["chunks"] and listed["last_indexed"] is not None

    # The same folders and model again: nothing to do. A new folder is added as it is: the
    # next index embeds its file only.
    rc, out, _ = cli(capsys, "add", "ref", str(docs), "--embedding-model", str(minilm_path))
    assert rc == 0 and "already has" in out
    more = tmp_path / "more"
    more.mkdir()
    (more / "extra.txt").write_text(TOPICS_TEXT_EXTRA, encoding="utf-8")
    rc, out, _ = cli(capsys, "add", "ref", str(more), "--embedding-model", str(minilm_path))
    assert rc == 0 and "Updated collection 'ref'" in out
    rc, out, _ = cli(capsys, "index", "ref", "--json")
    again = json.loads(out)
    assert (again["added"], again["unchanged"], again["removed"]) == (1, N_TOPICS, 0)
    rc, out, _ = cli(capsys, "list", "--json")
    [listed] = json.loads(out)
    assert listed["roots"] == [str(docs.resolve()), str(more.resolve())]
    assert listed["files"] == N_TOPICS + 1

    # Another embedding model (a copy of the file counts as one) needs --reembed, which
    # empties the index: its vectors would not compare with the old ones.
    other = tmp_path / "other-minilm.gguf"
    shutil.copyfile(minilm_path, other)
    rc, _, err = cli(capsys, "add", "ref", str(docs), "--embedding-model", str(other))
    assert rc == 2 and "--reembed" in one_line_error(err)
    rc, out, _ = cli(capsys, "add", "ref", str(docs), "--embedding-model", str(other), "--reembed")
    assert rc == 0 and "index emptied" in out
    rc, out, _ = cli(capsys, "list", "--json")
    [listed] = json.loads(out)
    assert listed["model_path"] == str(other.resolve()) and listed["chunks"] == 0

    rc, out, _ = cli(capsys, "remove", "ref")
    assert rc == 0 and "Removed" in out
    assert all(p.exists() for p in files.values())
    rc, out, _ = cli(capsys, "list")
    assert out.startswith("No collections yet")


@pytest.mark.slow
@pytest.mark.model
def test_without_a_model_the_default_is_made_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    for name, text in NOTES.items():
        (notes / name).write_text(text + "\n", encoding="utf-8")
    made = AppPaths.default().models / FILE_NAME
    rc, out, err = cli(capsys, "add", "notes", str(notes))
    assert rc == 0, err
    assert out.startswith("Created collection 'notes' (1 folder(s), model All MiniLM L6 v2")
    assert "Making the default embedding model all-MiniLM-L6-v2" in err and made.is_file()
    rc, out, err = cli(capsys, "index", "notes", "--json")
    assert rc == 0 and json.loads(out)["added"] == 3, err
    rc, out, _ = cli(capsys, "search", "notes", SALAD, "--json")
    hits = json.loads(out)
    assert rc == 0 and Path(hits[0]["path"]).name == "garden.txt"
    assert hits[0]["keyword_rank"] is None  # no keyword hit of ~0 evidence outranks it

    # Made once: a second collection and a folder added to the first use the file as it is.
    mtime = made.stat().st_mtime_ns
    more = tmp_path / "more"
    more.mkdir()
    rc, _, err = cli(capsys, "add", "other", str(more))
    assert rc == 0 and "Making" not in err
    rc, out, err = cli(capsys, "add", "notes", str(more))
    assert rc == 0 and out.startswith("Updated collection 'notes' (2 folder(s))")
    assert "Making" not in err and made.stat().st_mtime_ns == mtime
    rc, out, _ = cli(capsys, "list", "--json")
    assert {c["model_path"] for c in json.loads(out)} == {str(made.resolve())}


def test_a_text_generator_is_not_an_embedding_model(
    tmp_path: Path, smollm2_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, err = cli(capsys, "add", "ref", str(tmp_path), "--embedding-model", str(smollm2_path))
    assert rc == 2
    assert "is a text generator, not an embedding model" in one_line_error(err)


def test_user_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = cli(capsys, "add", "ref", str(tmp_path / "nope"), "--embedding-model", "x")
    assert rc == 2 and "no such file or folder" in one_line_error(err)
    _fill_by_hand()
    for args in (("index", "nope"), ("search", "nope", "q"), ("remove", "nope")):
        rc, _, err = cli(capsys, *args)
        assert rc == 2
        assert "no collection named 'nope' (collections: hand)" in one_line_error(err)
    with pytest.raises(SystemExit) as exc:
        main(["docs", "search", "hand", "q", "-k", "0"])
    assert exc.value.code == 2
    assert "must be at least 1" in capsys.readouterr().err


def _fill_by_hand() -> dict[str, Path]:
    """A collection written through RagStore with bag-of-words vectors: no model needed."""
    texts = {
        "/docs/lighthouse.txt": "A lighthouse is a tower with a bright lamp for ships.",
        "/docs/bread.txt": "Bread is baked from flour, water, salt and yeast.",
    }
    with RagStore(index_path()) as store:
        store.create_collection(
            "hand", [Path("/docs")], model_name="bow", model_path="/nowhere.gguf", dim=DIM
        )
        for path, text in texts.items():
            store.replace_file(
                "hand", found(Path(path)), "0" * 64, make_chunks([text]), [bow_vector(text)]
            )
    return {p: Path(p) for p in texts}


def test_keyword_search_needs_no_model(capsys: pytest.CaptureFixture[str]) -> None:
    _fill_by_hand()  # its model file does not exist: keyword search must not load it
    rc, out, _ = cli(capsys, "search", "hand", "which tower guides ships?", "--mode", "keyword")
    assert rc == 0
    assert out.startswith("1. /docs/lighthouse.txt  [")
    assert "A lighthouse is a tower" in out
    rc, out, _ = cli(capsys, "search", "hand", "flour", "--mode", "keyword", "--json")
    [hit] = json.loads(out)
    assert hit["path"] == "/docs/bread.txt" and hit["keyword_rank"] == 1
    rc, _, err = cli(capsys, "search", "hand", "flour")
    assert rc == 2 and "embedding model of 'hand' is gone" in one_line_error(err)


LAMP_NOTES = {
    "/notes/oil.txt": "The lamp burns whale oil every night in the tower.",
    "/notes/keeper.txt": "A keeper trims the lamp and cleans its glass at dusk.",
    "/notes/boat.txt": "Oil for the lamp comes by boat once a month.",
    "/notes/storm.txt": "Storms break the glass of the lamp room in winter.",
}


def test_search_reranked_follows_the_rerankers_scores(
    reranker_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with RagStore(index_path()) as store:
        store.create_collection(
            "notes", [Path("/notes")], model_name="bow", model_path="/nowhere.gguf", dim=DIM
        )
        for path, text in LAMP_NOTES.items():
            store.replace_file(
                "notes", found(Path(path)), "0" * 64, make_chunks([text]), [bow_vector(text)]
            )
    question = "what is done to the lamp"
    rc, out, err = cli(capsys, "search", "notes", question, "--mode", "keyword", "--json")
    assert rc == 0, err
    plain = json.loads(out)
    assert len(plain) == 4 and all("rerank_score" not in h for h in plain)

    model = LoadedEmbedding(reranker_path, n_threads=2, first_loads=None)
    try:
        scores = model.rerank(question, [h["text"] for h in plain])
        # Scored as the search scores them: the same texts in one batch (a batch of other
        # texts may round a score differently in its last digits).
        scores_of_two = model.rerank(question, [h["text"] for h in plain[:2]])
    finally:
        model.close()
    expected = sorted(zip(scores, (h["path"] for h in plain), strict=True), reverse=True)[:3]
    args = ("search", "notes", question, "--mode", "keyword", "-k", "3")
    rc, out, err = cli(capsys, *args, "--rerank", str(reranker_path), "--json")
    assert rc == 0, err
    hits = json.loads(out)
    assert [(h["rerank_score"], h["path"]) for h in hits] == expected
    assert [h["path"] for h in hits] != [h["path"] for h in plain[:3]]  # re-sorted
    by_path = {h["path"]: h for h in plain}
    assert all(h["score"] == by_path[h["path"]]["score"] for h in hits)  # the search's own
    # Two candidates: the best one of the keyword search's first two.
    one = ("search", "notes", question, "--mode", "keyword", "-k", "1")
    rc, out, _ = cli(capsys, *one, "--rerank", str(reranker_path), "--candidates", "2", "--json")
    assert rc == 0
    two = zip(scores_of_two, (h["path"] for h in plain[:2]), strict=True)
    assert [(h["rerank_score"], h["path"]) for h in json.loads(out)] == [max(two)]
    rc, out, _ = cli(capsys, *args, "--rerank", str(reranker_path))
    assert rc == 0 and out.startswith(f"1. {expected[0][1]}  [0:")
    assert f"rerank {expected[0][0]:.4f}" in out


def test_rerank_refusals_are_one_line(
    tmp_path: Path, minilm_path: Path, reranker_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _fill_by_hand()
    rc, _, err = cli(capsys, "search", "hand", "lamp", "--candidates", "5")
    assert rc == 2 and "--candidates goes with --rerank MODEL" in one_line_error(err)
    rc, _, err = cli(capsys, "search", "hand", "lamp", "--rerank", str(minilm_path))
    assert rc == 2 and "is an embedding model, not a reranker" in one_line_error(err)
    rc, _, err = cli(capsys, "search", "hand", "lamp", "--rerank", "no-such-model")
    assert rc == 2 and "no model called 'no-such-model'" in one_line_error(err)
    rc, _, err = cli(capsys, "add", "r", str(tmp_path), "--embedding-model", str(reranker_path))
    assert rc == 2 and "is a reranker, not an embedding model" in one_line_error(err)
