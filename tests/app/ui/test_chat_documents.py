"""A chat grounded in a collection, on the real engine thread with a scripted fake model, a
real documents index and a real chat store; the embedder is the hashed bag of words of the
index tests (the real models' run is tests/app/ui/test_chat_documents_e2e.py).

The question is searched before the model runs (RETRIEVING), the passages go in the system
message numbered, and the answer carries them: shown as its sources, stored, restored on
reopening. Continue reuses them, Regenerate searches again, Stop while searching ends the
reply, and a search that fails fails the answer with one line. The chat's reranker (the test
one, from Chat settings) re-sorts the passages.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from PySide6.QtCore import Qt, QUrl
from pytestqt.qtbot import QtBot

from app.main import library_rerankers
from app.services.chat_store import ChatStore
from app.services.embedding_models import LoadedEmbedding
from app.services.library import ModelLibrary
from app.services.retrieval import Retriever
from app.ui.active_reply import ReplyState
from app.ui.chat_model import ChatModel
from app.ui.chat_settings import ChatSettingsPanel
from app.ui.chat_view import ChatView
from app.ui.citations import SourcesBlock, source_tooltip, source_url
from app.ui.controller import ChatController
from app.ui.library_model import LibraryModel
from app.ui.worker import EngineHost, EngineWorker
from engine.rag.grounding import INSTRUCTIONS, Source
from engine.rag.indexer import index_collection
from engine.rag.store import RagStore
from engine.settings import LoadParams
from tests.engine.rag.helpers import DIM, bow_vector, word_count
from tests.fakes import FakeModels, FakeReply

MODEL = Path("fake-model.gguf")
WAIT_MS = 5_000
LAMP = "The lamp of the lighthouse burns whale oil and is trimmed at dusk."
BELL = "The fog bell rings every thirty seconds when the fog rolls in."


class BowEmbedding:
    """The hashed bag of words as a loaded embedding model, counting its questions."""

    def __init__(self) -> None:
        self.questions: list[str] = []
        self.closed = False

    def embed(self, text: str) -> list[float]:
        self.questions.append(text)
        return bow_vector(text)

    def close(self) -> None:
        self.closed = True


@dataclass
class Rig:
    qtbot: QtBot
    models: FakeModels
    host: EngineHost
    chat: ChatModel
    controller: ChatController
    store: ChatStore
    embedding: BowEmbedding
    docs: Path

    def idle(self) -> None:
        self.qtbot.waitUntil(lambda: not self.controller.busy, timeout=WAIT_MS)

    def load(self) -> None:
        assert self.controller.load(MODEL, LoadParams(n_ctx=4096))
        self.qtbot.waitUntil(lambda: self.controller.loaded is not None, timeout=WAIT_MS)

    def prompt(self, i: int = -1) -> str:
        return bytes(self.models.prompts[i]).decode()


@pytest.fixture
def rig(qtbot: QtBot, tmp_path: Path) -> Iterator[Rig]:
    folder = tmp_path / "keeping"
    folder.mkdir()
    (folder / "lamp.txt").write_text(f"Lamps\n\n{LAMP}\n", encoding="utf-8")
    (folder / "bell.txt").write_text(BELL + "\n", encoding="utf-8")
    (tmp_path / "empty").mkdir()
    fake_gguf = tmp_path / "embed.gguf"  # the collection's model file (read by BowEmbedding)
    fake_gguf.write_bytes(b"GGUF")
    index = tmp_path / "documents.sqlite3"
    with RagStore(index) as rs:
        rs.create_collection(
            "keeping", [folder], model_name="bow", model_path=str(fake_gguf), dim=DIM
        )
        index_collection(rs, "keeping", lambda ts: [bow_vector(t) for t in ts], word_count)
        rs.create_collection(
            "empty", [tmp_path / "empty"], model_name="bow", model_path=str(fake_gguf), dim=DIM
        )
    embedding = BowEmbedding()
    retriever = Retriever(lambda: RagStore(index), load=lambda _path: embedding)
    models = FakeModels(name="Fake Model")
    host = EngineHost(EngineWorker(models, token_interval_s=0))
    chat = ChatModel()
    store = ChatStore(tmp_path / "chats.sqlite3")
    controller = ChatController(
        host, chat, library=lambda: (MODEL, LoadParams(n_ctx=4096)), store=store
    )
    controller.use_documents(retriever)
    controller.set_chat_settings({"collections": ["keeping"], "docs_k": 2})
    yield Rig(qtbot, models, host, chat, controller, store, embedding, folder)
    models.release_loads()
    controller.close_documents()
    host.shutdown()
    retriever.close()
    store.close()


def test_the_question_is_searched_and_the_passages_go_in_the_prompt(rig: Rig) -> None:
    c = rig.controller
    states: list[ReplyState] = []
    c.busy_changed.connect(lambda _b: states.append(c.reply.state) if c.reply else None)
    rig.models.reply = FakeReply(["It burns oil [1]."])
    assert c.send("What does the lamp burn?")
    rig.idle()
    assert ReplyState.RETRIEVING in states
    assert rig.embedding.questions == ["What does the lamp burn?"]
    prompt = rig.prompt()
    assert INSTRUCTIONS in prompt
    answer = rig.chat.message(1)
    g = answer.grounding
    assert g is not None and g.sources and answer.text == "It burns oil [1]."
    first = g.sources[0]
    assert first.name == "lamp.txt" and LAMP in first.text
    assert f"[1] lamp.txt, line 1\n{first.text.strip()}" in prompt
    assert first.line == 1  # the chunk starts at the file's first line
    # The fake counts a byte a token: the figures are the block's size in that count.
    assert g.tokens == len(g.text.encode()) and g.tokens <= g.budget
    assert g.summary.startswith(f"Retrieval adds {g.tokens:,} tokens from {len(g.sources)}")
    # Stored with the answer, and back when the chat is opened again.
    cid = c.conversation_id
    assert cid is not None
    stored = rig.store.active_path(cid)[1]
    assert stored.grounding["sources"][0]["path"] == first.path
    c.new_chat()
    c.open_conversation(cid)
    assert rig.chat.message(1).grounding == g
    # The next question's history holds the answer's text, not its passages.
    rig.models.reply = FakeReply(["It rings."])
    assert c.send("And the bell?")
    rig.idle()
    prompt = rig.prompt()
    assert prompt.count(INSTRUCTIONS) == 1 and "fog bell" in prompt


def test_continue_reuses_the_stored_passages_and_regenerate_searches_again(rig: Rig) -> None:
    c = rig.controller
    rig.models.reply = FakeReply(["It burns", " whale oil."], hold_after=1)
    assert c.send("What does the lamp burn?")
    rig.qtbot.waitUntil(lambda: rig.chat.rowCount() == 2 and rig.chat.message(1).text != "")
    c.stop()
    rig.idle()
    first = rig.chat.message(1).grounding
    assert rig.chat.message(1).state == "stopped" and first is not None
    rig.models.reply = FakeReply([" Every night."])
    assert c.continue_reply(1)
    rig.idle()
    assert len(rig.embedding.questions) == 1  # no new search
    assert first.text in rig.prompt()
    assert rig.chat.message(1).grounding == first
    rig.models.reply = FakeReply(["Oil."])
    assert c.regenerate(1)
    rig.idle()
    assert len(rig.embedding.questions) == 2
    assert rig.chat.message(1).grounding is not None and first.text in rig.prompt()


def test_stop_while_searching_ends_the_reply(rig: Rig, qtbot: QtBot) -> None:
    c = rig.controller
    rig.load()
    rig.models.reply = FakeReply(["never"])
    assert c.send("The lamp?")  # the search's result comes through the event loop
    assert c.reply is not None and c.reply.state is ReplyState.RETRIEVING
    c.stop()
    assert c.reply is None and not c.busy
    qtbot.wait(100)  # the search's result, when it comes, is dropped
    assert rig.chat.rowCount() == 1 and rig.models.prompts == []


def test_a_collection_that_is_gone_fails_the_answer_in_one_line(rig: Rig) -> None:
    c = rig.controller
    errors: list[str] = []
    c.error.connect(errors.append)
    c.set_chat_settings({"collections": ["keeping", "attic"]})
    assert c.send("The lamp?")
    rig.idle()
    assert errors == [
        "Documents: the chat's collection 'attic' is gone: untick it in Chat settings"
    ]
    answer = rig.chat.message(1)
    assert answer.state == "error" and answer.error == errors[0]
    assert rig.models.prompts == []  # the model never ran ungrounded


def test_nothing_found_is_said_on_the_answer(rig: Rig) -> None:
    rig.controller.set_chat_settings({"collections": ["empty"]})
    rig.models.reply = FakeReply(["I do not know."])
    assert rig.controller.send("What does the lamp burn?")
    rig.idle()
    g = rig.chat.message(1).grounding
    assert g is not None and g.sources == () and g.offered == 0
    assert g.summary == "Nothing in empty matches the question: this answer is not grounded"
    assert INSTRUCTIONS not in rig.prompt()
    assert rig.chat.message(1).text == "I do not know."


def test_the_view_lists_the_sources_and_opens_them(
    rig: Rig, qtbot: QtBot, monkeypatch: pytest.MonkeyPatch
) -> None:
    view = ChatView(rig.chat)
    qtbot.addWidget(view)
    rig.models.reply = FakeReply(["Oil [1]."])
    assert rig.controller.send("What does the lamp burn?")
    rig.idle()
    block = view.message_widgets[1].sources
    g = rig.chat.message(1).grounding
    assert g is not None and block.grounding is g and not block.isHidden()
    assert block.summary.text() == g.summary
    assert [w.accessibleName() for w in block.links] == [s.label for s in g.sources]
    assert view.message_widgets[0].sources.isHidden()  # the question has none
    opened: list[QUrl] = []
    monkeypatch.setattr(SourcesBlock, "open_url", opened.append)
    block.links[0].linkActivated.emit("1")
    assert opened == [QUrl.fromLocalFile(g.sources[0].path)]
    assert "line 1" in block.links[0].toolTip()


def test_a_pdf_source_opens_at_its_page() -> None:
    s = Source(3, "/docs/guide.pdf", 4, "Oil", 0, 9, None, "Fill it.")
    url = source_url(s)
    assert url.isLocalFile() and url.toLocalFile() == "/docs/guide.pdf"
    assert url.fragment() == "page=4"
    assert source_tooltip(s) == "/docs/guide.pdf, page 4, under “Oil”\n\nFill it."
    assert source_url(Source(1, "/d/a.txt", None, None, 0, 1, 3, "x")).fragment() == ""


def test_the_settings_list_the_collections_to_tick(qtbot: QtBot, tmp_path: Path) -> None:
    with ChatStore(tmp_path / "c.sqlite3") as store:
        names = ["keeping", "recipes"]
        panel = ChatSettingsPanel(store, collections=lambda: names)
        qtbot.addWidget(panel)
        changes: list[dict[str, object]] = []
        panel.changed.connect(changes.append)
        assert [panel.collections.item(i).text() for i in range(2)] == names
        assert panel.no_collections.isHidden()
        panel.collections.item(1).setCheckState(Qt.CheckState.Checked)
        assert changes[-1] == {"collections": ["recipes"]}
        panel.docs_k.setValue(8)
        panel.docs_budget.setValue(40)
        assert changes[-1] == {"collections": ["recipes"], "docs_k": 8, "docs_budget": 40}
        # A chat naming a collection the index lost: listed, marked, ticked.
        panel.set_settings({"collections": ["attic"]})
        items = [panel.collections.item(i) for i in range(panel.collections.count())]
        assert [(i.text(), i.checkState() == Qt.CheckState.Checked) for i in items] == [
            ("keeping", False),
            ("recipes", False),
            ("attic (removed)", True),
        ]
        items[2].setCheckState(Qt.CheckState.Unchecked)
        assert "collections" not in changes[-1]
        names.clear()
        panel.set_settings({})
        assert panel.collections.isHidden() and not panel.no_collections.isHidden()
        assert "candlewick docs add" in panel.no_collections.text()


def test_the_chat_s_reranker_re_sorts_its_passages(rig: Rig, reranker_path: Path) -> None:
    """The controller passes the chat's reranker to the search: with one passage asked for,
    the one the reranker scores best is the answer's source, not the search's first."""
    c = rig.controller
    question = "When does the bell ring?"
    retriever = c.retriever
    assert retriever is not None
    found = retriever.search(["keeping"], question, 2)  # the fusion's order
    assert [Path(h.path).name for h in found] == ["bell.txt", "lamp.txt"]
    scorer = LoadedEmbedding(reranker_path, n_threads=2, first_loads=None)
    try:
        scores = scorer.rerank(question, [h.text for h in found])
    finally:
        scorer.close()
    best = max(zip(scores, found, strict=True), key=lambda p: p[0])[1]
    assert best is not found[0]  # so the test can tell whether the reranker ran

    c.set_chat_settings({"collections": ["keeping"], "docs_k": 1})
    rig.models.reply = FakeReply(["Every thirty seconds."])
    assert c.send(question)
    rig.idle()
    g = rig.chat.message(1).grounding
    assert g is not None and [s.name for s in g.sources] == ["bell.txt"]

    c.set_chat_settings(
        {"collections": ["keeping"], "docs_k": 1, "docs_reranker": str(reranker_path)}
    )
    rig.models.reply = FakeReply(["Every thirty seconds."])
    assert c.send(question)
    rig.idle()
    g = rig.chat.message(3).grounding
    assert g is not None and [s.path for s in g.sources] == [str(best.path)]


def test_a_reranker_that_is_gone_fails_the_answer_in_one_line(rig: Rig, tmp_path: Path) -> None:
    c = rig.controller
    errors: list[str] = []
    c.error.connect(errors.append)
    gone = tmp_path / "deleted-reranker.gguf"
    c.set_chat_settings({"collections": ["keeping"], "docs_reranker": str(gone)})
    assert c.send("The lamp?")
    rig.idle()
    assert errors == [f"Documents: the reranker is gone: {gone}"]
    assert rig.chat.message(1).state == "error" and rig.models.prompts == []


def test_the_settings_offer_the_rerankers_per_chat(qtbot: QtBot, tmp_path: Path) -> None:
    rerankers = [("MiniLM rank", Path("/models/rank.gguf")), ("BGE", Path("/models/bge.gguf"))]
    with ChatStore(tmp_path / "c.sqlite3") as store:
        panel = ChatSettingsPanel(
            store, collections=lambda: ["keeping"], rerankers=lambda: rerankers
        )
        qtbot.addWidget(panel)
        changes: list[dict[str, object]] = []
        panel.changed.connect(changes.append)
        combo = panel.docs_reranker
        assert [combo.itemText(i) for i in range(combo.count())] == ["None", "MiniLM rank", "BGE"]
        assert combo.currentText() == "None" and not combo.isEnabled()  # no collection yet
        assert "costs time" in combo.toolTip()
        panel.collections.item(0).setCheckState(Qt.CheckState.Checked)
        assert combo.isEnabled()
        combo.setCurrentIndex(2)
        assert changes[-1] == {"collections": ["keeping"], "docs_reranker": "/models/bge.gguf"}
        # Another chat: none; then back to the first, its own again.
        panel.set_settings({"collections": ["keeping"]})
        assert combo.currentText() == "None" and "docs_reranker" not in panel.settings()
        panel.set_settings(changes[-1])
        assert combo.currentText() == "BGE" and panel.settings() == changes[-1]
        # One the library lost: listed, marked, chosen, so it can be changed.
        panel.set_settings({"collections": ["keeping"], "docs_reranker": "/old/gone.gguf"})
        assert combo.currentText() == "gone.gguf (not in the library)"
        combo.setCurrentIndex(0)
        assert changes[-1] == {"collections": ["keeping"]}
        panel.collections.item(0).setCheckState(Qt.CheckState.Unchecked)
        assert not combo.isEnabled()


def test_the_window_offers_the_library_s_rerankers_only(
    tmp_path: Path, minilm_path: Path, reranker_path: Path
) -> None:
    lib = ModelLibrary(tmp_path / "models", discovery=False)
    lib.import_file(minilm_path)
    rank = lib.import_file(reranker_path)
    assert library_rerankers(LibraryModel(lib.entries())) == [(rank.name, rank.path)]
