"""Chat flow between the view, the conversation model and the engine thread.

Sending loads the selected model first when it is not the one loaded (the newcomer's path:
type, press Enter, watch it load and answer). Engine signals are applied to the item model
here, on the GUI thread.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.ui.chat_model import ChatModel
from app.ui.worker import EngineHost, LoadedModel
from engine.runtime import GenerationStats, LoadParams, SamplingParams

ModelChoice = Callable[[], tuple[Path, LoadParams] | None]


class ChatController(QObject):
    busy_changed = Signal(bool)  # a reply is loading or streaming
    error = Signal(str)  # a message for the window's error banner
    notice = Signal(str)  # status text ("Loading SmolLM2…")

    def __init__(self, engine: EngineHost, chat: ChatModel, choose_model: ModelChoice,
                 sampling: SamplingParams | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.engine = engine
        self.chat = chat
        self.choose_model = choose_model
        self.sampling = sampling or SamplingParams()
        self.loaded: LoadedModel | None = None
        self.loading: Path | None = None
        self.reply_row: int | None = None  # the assistant message being streamed
        self._pending = False  # generate as soon as the model has loaded
        # Replies abandoned by "new chat" that the engine has not finished yet: their last
        # tokens and their end signal are still queued and belong to no message.
        self._abandoned = 0
        w = engine.worker
        w.loaded.connect(self._on_loaded)
        w.load_cancelled.connect(self._on_load_cancelled)
        w.tokens.connect(self._on_tokens)
        w.finished.connect(self._on_finished)
        w.failed.connect(self._on_failed)
        w.unloaded.connect(self._on_unloaded)

    @property
    def busy(self) -> bool:
        return self.reply_row is not None or self._pending

    # -- requests from the window ----------------------------------------------------------

    def load(self, path: Path, params: LoadParams) -> bool:
        """Start loading; False (with a message) while a reply is still streaming."""
        if self.reply_row is not None:
            self.error.emit("Wait for the reply to finish (or press Stop) before loading")
            return False
        self.loading = Path(path)
        self.notice.emit(f"Loading {Path(path).name}…")
        self.engine.load(path, params)
        return True

    def cancel_load(self) -> None:
        if self.loading is not None:
            self.engine.cancel_load()

    def eject(self) -> None:
        if self.reply_row is not None:
            self.engine.stop()
        self.engine.unload()

    def send(self, text: str) -> bool:
        """Add the user's message and start the reply; False when one is still running."""
        if self.busy or not text.strip():
            return False
        choice = self.choose_model()
        if choice is None and self.loaded is None:
            self.error.emit("Select a model in the library first")
            return False
        self.chat.append("user", text)
        if choice is not None and (self.loaded is None or self.loaded.path != choice[0]):
            self._pending = True
            self.busy_changed.emit(True)
            if self.loading != choice[0]:
                self.load(*choice)
            return True
        self._start_reply()
        return True

    def stop(self) -> None:
        if self.reply_row is not None:
            self.engine.stop()
        elif self._pending:
            self._pending = False
            self.engine.cancel_load()
            self.busy_changed.emit(False)

    def new_chat(self) -> None:
        if self.reply_row is not None:
            self.engine.stop()
            self._abandoned += 1
        self.reply_row = None
        self._pending = False
        self.chat.clear()
        self.busy_changed.emit(False)

    # -- engine signals --------------------------------------------------------------------

    def _start_reply(self) -> None:
        messages = self.chat.conversation.for_model()
        self.reply_row = self.chat.append("assistant", "", "streaming")
        self.busy_changed.emit(True)
        self.engine.generate(messages, self.sampling)

    def _on_loaded(self, info: LoadedModel) -> None:
        self.loaded = info
        self.loading = None
        self.notice.emit(f"Loaded {info.name}")
        if self._pending:
            self._pending = False
            self._start_reply()

    def _on_load_cancelled(self) -> None:
        self.loading = None
        self.loaded = None  # the worker frees the old model before loading a new one
        self.notice.emit("Loading cancelled")
        if self._pending:
            self._pending = False
            self.busy_changed.emit(False)

    def _on_unloaded(self) -> None:
        self.loaded = None
        self.notice.emit("Model ejected")

    def _on_tokens(self, text: str, _n: int) -> None:
        if self.reply_row is not None and not self._abandoned:
            self.chat.append_text(self.reply_row, text)

    def _on_finished(self, stats: GenerationStats) -> None:
        if self._abandoned:
            self._abandoned -= 1
            return
        if self.reply_row is not None:
            self.chat.finish(self.reply_row, stats)
        self.reply_row = None
        self.busy_changed.emit(False)

    def _on_failed(self, message: str) -> None:
        if self._abandoned and self.loading is None:
            self._abandoned -= 1  # the abandoned reply ended with an error: nobody's business
            return
        if self.loading is not None:
            self.loading = None
            # The old model was freed before loading the new one.
            self.loaded = None
        if self.reply_row is not None:
            self.chat.fail(self.reply_row, message)
            self.reply_row = None
        self._pending = False
        self.busy_changed.emit(False)
        self.error.emit(message)
