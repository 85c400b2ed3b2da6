"""Chat with a collection end to end, on the real models: all-MiniLM-L6-v2 indexes a few
files and embeds the question, the bundled SmolLM2 answers in the window. The collection is
ticked in Chat settings, the question sent from the input; the model's system message holds
the numbered passages, the answer shows its sources and the budget line, and the store and
the Markdown export keep them. The tiny model's wording is not checked."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.services.chat_exchange import export_all, export_text
from app.services.documents import open_documents
from app.ui.main_window import MainWindow
from engine.host.runtime import Model
from engine.rag.grounding import INSTRUCTIONS
from engine.rag.indexer import index_collection
from engine.server.embeddings import Embedder
from engine.settings import LoadParams, SamplingParams
from tests.app.ui.test_ui_window import close_window, open_window
from tests.engine.rag.helpers import topic_files

pytestmark = pytest.mark.qt_log_ignore("This plugin does not support propagateSizeHints")


def index_topics(folder: Path, minilm: Path) -> dict[str, Path]:
    """A collection 'python' of three short language reference topics, in the app's index."""
    files = topic_files(folder, 3)
    model = Model(minilm, LoadParams(n_ctx=512, n_threads=2))
    embedder = Embedder(model)
    try:
        with open_documents() as store:
            store.create_collection(
                "python",
                [folder],
                model_name="all-MiniLM-L6-v2",
                model_path=str(minilm),
                dim=len(embedder.embed("dimension")[0]),
            )
            report = index_collection(
                store,
                "python",
                lambda texts: [embedder.embed(t)[0] for t in texts],
                lambda t: len(model.tokenize(t, add_special=True, parse_special=False)),
            )
            assert report.added == 3 and report.chunks >= 3
    finally:
        embedder.close()
        model.close()
    return files


@pytest.fixture
def window(qtbot: QtBot) -> Iterator[MainWindow]:
    w = open_window(qtbot, SamplingParams(temperature=0.0, max_tokens=8))
    yield w
    close_window(w)


def test_a_question_is_answered_from_the_collection_with_its_sources(
    window: MainWindow, qtbot: QtBot, tmp_path: Path, minilm_path: Path
) -> None:
    files = index_topics(tmp_path / "topics", minilm_path)
    panel = window.chat_settings
    assert panel is not None
    panel.refresh_collections()
    item = panel.collections.item(0)
    assert item.text() == "python"
    item.setCheckState(Qt.CheckState.Checked)  # through the panel to the controller
    assert window.controller.chat_settings["collections"] == ["python"]

    asked: list[list[dict[str, Any]]] = []
    generate = window.engine.generate

    def recording(messages: Any, *args: Any, **kwargs: Any) -> int:
        asked.append([dict(m) for m in messages])
        return generate(messages, *args, **kwargs)

    window.engine.generate = recording  # type: ignore[method-assign]
    qtbot.keyClicks(window.chat_view.input, "What does the await expression do to a coroutine?")
    qtbot.keyClick(window.chat_view.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not window.controller.busy, timeout=180_000)

    answer = window.chat_model.message(1)
    assert answer.role == "assistant" and answer.state == "done", answer.error
    g = answer.grounding
    assert g is not None and g.sources, g
    top = g.sources[0]
    assert Path(top.path) == files["await"]  # the topic the question is about ranks first
    assert top.line == 1 and top.label == "[1] await.txt, line 1"
    # The prompt the model got: the numbered passages in its system message.
    (messages,) = asked
    assert messages[0]["role"] == "system"
    system = messages[0]["content"]
    assert system.startswith(INSTRUCTIONS)
    assert f"[1] await.txt, line 1\n{top.text.strip()}" in system
    assert messages[-1] == {
        "role": "user",
        "content": "What does the await expression do to a coroutine?",
    }
    loaded = window.controller.loaded
    assert loaded is not None and 0 < g.tokens <= g.budget <= loaded.n_ctx // 4
    # What the user sees: the budget line and the numbered sources under the answer.
    block = window.chat_view.message_widgets[1].sources
    assert block.isVisible() and block.summary.text() == g.summary
    assert block.summary.text().startswith(f"Retrieval adds {g.tokens:,} tokens from ")
    assert [w.accessibleName() for w in block.links] == [s.label for s in g.sources]
    # Kept: in the store, and in the exports.
    store = window.store
    cid = window.controller.conversation_id
    assert store is not None and cid is not None
    stored = store.active_path(cid)[1]
    assert stored.grounding["sources"][0]["path"] == top.path
    assert stored.grounding["tokens"] == g.tokens
    data = export_all(store, [cid])
    md = export_text(data, "md")
    assert "**Sources**" in md and "- [1] await.txt, line 1" in md
    exported = data["conversations"][0]["messages"][1]["grounding"]
    assert exported["sources"][0]["text"] == top.text
    # The embedding model stays loaded for the next question.
    assert window.controller.retriever is not None
    assert window.controller.retriever.loaded == [minilm_path]
