"""The Documents side tab: collections of the user's folders, indexed for search.

It lists the collections of the documents index (the same file `candlewick docs` uses), creates
them (name, folders and files, an embedding model: the default one, made from the installed
package the first time it indexes, or one of the library), adds folders, indexes one
at a time with live progress and Cancel (`app.ui.index_job`: off the GUI thread, held while
the chat answers), shows the files it skipped and why, changes a collection's model (which
empties its index) and removes one (the index only, never the files).

Dialogs and confirmations are plain callables, so tests answer them without a modal loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.services.default_embedding import DIM, MODEL_NAME, DefaultEmbedding, DefaultEmbeddingError
from app.services.library import LibraryEntry, ModelLibrary
from app.ui.index_job import (
    ChatGate,
    DocumentsError,
    Embedding,
    EmbeddingChoice,
    EmbeddingLoader,
    IndexJob,
    embedding_choice,
)
from app.ui.library_model import embeds
from engine.rag.indexer import IndexProgress, IndexReport
from engine.rag.store import Collection, RagStore, StoreError

Confirm = Callable[[str, str], bool]  # (title, text) -> yes?
PickPaths = Callable[[], list[Path]]  # folders or files the user chose ([] = none)
PickModel = Callable[[list[LibraryEntry], str], LibraryEntry | None]  # (choices, current)

EMPTY_TEXT = (
    "A collection is a set of your folders and files that Candlewick reads and indexes, so "
    "that you can search them by keywords and by meaning. Nothing leaves this computer, and "
    "your files are never changed.\n\n"
    "To start: New collection…, choose the folders and an embedding model (such as "
    "all-MiniLM-L6-v2), then Index."
)
NO_EMBEDDING_MODEL = (
    "No embedding model in the library: download one (all-MiniLM-L6-v2 or nomic-embed-text, "
    "GGUF) in the Download tab, or import a .gguf file."
)
PAUSED_TEXT = "Paused while the chat answers"
DEFAULT_LABEL = f"{MODEL_NAME} (default)"
ERROR_STYLE = "color: #b00020;"  # readable on light and dark


def duration(seconds: float) -> str:
    s = int(seconds + 0.5)
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"


def when(ts: float | None) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M") if ts else "never"


def progress_text(p: IndexProgress) -> str:
    eta = f" · about {duration(p.eta_seconds)} left" if p.eta_seconds is not None else ""
    return f"{p.files_done}/{p.files_total} files · {p.chunks} chunks{eta}"


def report_text(name: str, r: IndexReport) -> str:
    rate = f" ({r.chunks / r.seconds:.1f} chunks/s)" if r.seconds > 0 and r.chunks else ""
    head = (
        f"Cancelled '{name}': indexing it again resumes where it stopped"
        if r.cancelled
        else f"Indexed '{name}'"
    )
    return (
        f"{head}. {r.added} added, {r.updated} updated, {r.unchanged} unchanged, "
        f"{r.removed} removed, {len(r.skipped)} skipped; {r.chunks} chunks in "
        f"{r.seconds:.1f} s{rate}."
    )


def _ask(parent: QWidget) -> Confirm:
    def confirm(title: str, text: str) -> bool:
        answer = QMessageBox.question(parent, title, text)
        return answer == QMessageBox.StandardButton.Yes

    return confirm


def _pick_folder(parent: QWidget) -> PickPaths:
    def pick() -> list[Path]:
        folder = QFileDialog.getExistingDirectory(parent, "Add a folder")
        return [Path(folder)] if folder else []

    return pick


def _pick_files(parent: QWidget) -> PickPaths:
    def pick() -> list[Path]:
        files, _ = QFileDialog.getOpenFileNames(parent, "Add files")
        return [Path(f) for f in files]

    return pick


def _pick_model(parent: QWidget) -> PickModel:
    def pick(choices: list[LibraryEntry], current: str) -> LibraryEntry | None:
        names = [e.name for e in choices]
        start = next((i for i, e in enumerate(choices) if str(e.path) == current), 0)
        name, ok = QInputDialog.getItem(
            parent, "Change model", "Embedding model:", names, start, False
        )
        return choices[names.index(name)] if ok and name in names else None

    return pick


class NewCollectionDialog(QDialog):
    """A name, folders and files, an embedding model; OK asks `create` (which answers an
    error line or None) and closes only once the collection exists."""

    def __init__(
        self,
        models: Sequence[LibraryEntry],
        create: Callable[[str, list[Path], Path], str | None],
        *,
        pick_folder: PickPaths,
        pick_files: PickPaths,
        default: Path | None = None,
        parent: QWidget | None = None,
    ) -> None:
        """`default`: the default embedding model's file (made or not yet), offered first."""
        super().__init__(parent)
        self.setWindowTitle("New collection")
        self._create = create
        self.name = QLineEdit()
        self.name.setAccessibleName("Collection name")
        self.name.setPlaceholderText("e.g. Papers")
        self.roots = QListWidget()
        self.roots.setAccessibleName("Folders and files")
        self.roots.setMinimumHeight(80)
        add_folder = QPushButton("Add folder…")
        add_files = QPushButton("Add files…")
        drop = QPushButton("Remove")
        add_folder.clicked.connect(lambda: self.add_paths(pick_folder()))
        add_files.clicked.connect(lambda: self.add_paths(pick_files()))
        drop.clicked.connect(self._drop_selected)
        self.model = QComboBox()
        self.model.setAccessibleName("Embedding model")
        if default is not None:
            self.model.addItem(DEFAULT_LABEL, str(default))
        for e in models:
            if default is None or e.path.resolve() != default.resolve():
                self.model.addItem(e.name, str(e.path))
        none = self.model.count() == 0
        self.message = QLabel(NO_EMBEDDING_MODEL if none else "")
        self.message.setWordWrap(True)
        self.message.setStyleSheet(ERROR_STYLE)
        self.message.setVisible(none)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        self.buttons.accepted.connect(self.try_create)
        self.buttons.rejected.connect(self.reject)

        row = QHBoxLayout()
        for b in (add_folder, add_files, drop):
            row.addWidget(b)
        form = QFormLayout()
        form.addRow("Name", self.name)
        form.addRow("Embedding model", self.model)
        lay = QVBoxLayout(self)
        lay.addLayout(form)
        lay.addWidget(QLabel("Folders and files"))
        lay.addWidget(self.roots, 1)
        lay.addLayout(row)
        lay.addWidget(self.message)
        lay.addWidget(self.buttons)

    def add_paths(self, paths: Sequence[Path]) -> None:
        have = set(self.paths())
        for p in paths:
            if p not in have:
                self.roots.addItem(str(p))
                have.add(p)

    def _drop_selected(self) -> None:
        for item in self.roots.selectedItems():
            self.roots.takeItem(self.roots.row(item))

    def paths(self) -> list[Path]:
        return [Path(self.roots.item(i).text()) for i in range(self.roots.count())]

    def try_create(self) -> None:
        model = self.model.currentData()
        problem = (
            NO_EMBEDDING_MODEL
            if not model
            else self._create(self.name.text().strip(), self.paths(), Path(str(model)))
        )
        if problem:
            self.message.setText(problem)
            self.message.show()
            return
        self.accept()


class SkippedDialog(QDialog):
    """The files a collection passed over, each with its reason."""

    def __init__(
        self, name: str, skipped: Sequence[tuple[Path, str]], parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"Skipped in '{name}'")
        self.tree = QTreeWidget()
        self.tree.setAccessibleName("Skipped files")
        self.tree.setHeaderLabels(["File", "Why"])
        self.tree.setRootIsDecorated(False)
        for path, why in skipped:
            item = QTreeWidgetItem([path.name or str(path), why])
            item.setToolTip(0, str(path))
            self.tree.addTopLevelItem(item)
        self.tree.resizeColumnToContents(0)
        close = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        close.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addWidget(self.tree, 1)
        lay.addWidget(close)
        self.resize(560, 360)


class DocumentsPanel(QWidget):
    def __init__(
        self,
        store: RagStore,
        library: ModelLibrary,
        load: EmbeddingLoader,
        parent: QWidget | None = None,
        *,
        confirm: Confirm | None = None,
        pick_folder: PickPaths | None = None,
        pick_files: PickPaths | None = None,
        pick_model: PickModel | None = None,
        default_embedding: DefaultEmbedding | None = None,
    ) -> None:
        """`default_embedding`: the model a new collection is offered first; a collection
        created with it before its file exists has the file made when it is indexed (off
        the GUI thread: it takes seconds)."""
        super().__init__(parent)
        self.store = store
        self.library = library
        self.default_embedding = default_embedding
        self.gate = ChatGate()
        self.job = IndexJob(store, self._loader(load), self.gate, self)
        self.confirm = confirm or _ask(self)
        self.pick_folder = pick_folder or _pick_folder(self)
        self.pick_files = pick_files or _pick_files(self)
        self.pick_model = pick_model or _pick_model(self)
        self._skipped: list[tuple[Path, str]] = []
        self._paused = False
        self._last_progress: IndexProgress | None = None

        self.empty = QLabel(EMPTY_TEXT)
        self.empty.setWordWrap(True)
        self.empty.setAccessibleName("What a collection is")
        self.list = QListWidget()
        self.list.setAccessibleName("Collections")
        self.list.setMinimumHeight(90)
        self.list.currentItemChanged.connect(lambda *_: self._show_details())

        self.details = QGroupBox("Collection")
        form = QFormLayout(self.details)
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        self.model_label = QLabel()
        self.folders_label = QLabel()
        self.counts_label = QLabel()
        self.when_label = QLabel()
        for label in (self.model_label, self.folders_label, self.counts_label, self.when_label):
            label.setWordWrap(True)
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.skipped_button = QPushButton("Skipped files…")
        self.skipped_button.clicked.connect(self.show_skipped)
        form.addRow("Model", self.model_label)
        form.addRow("Folders", self.folders_label)
        form.addRow("Index", self.counts_label)
        form.addRow("Indexed", self.when_label)
        form.addRow(self.skipped_button)

        self.progress = QProgressBar()
        self.progress.setAccessibleName("Indexing progress")
        self.progress.hide()
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.status.setAccessibleName("Documents status")
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.new_button = QPushButton("New collection…")
        self.add_button = QPushButton("Add folder…")
        self.index_button = QPushButton("Index")
        self.cancel_button = QPushButton("Cancel")
        self.model_button = QPushButton("Change model…")
        self.remove_button = QPushButton("Remove…")
        self.new_button.clicked.connect(self.new_collection)
        self.add_button.clicked.connect(self.add_folder)
        self.index_button.clicked.connect(self.index_selected)
        self.cancel_button.clicked.connect(self.cancel)
        self.model_button.clicked.connect(self.change_model)
        self.remove_button.clicked.connect(self.remove_selected)
        self.index_button.setToolTip("Read new and changed files; resumes a cancelled run")
        self.model_button.setToolTip("Embed the collection again with another model")
        self.remove_button.setToolTip("Remove the collection's index (your files stay)")
        buttons = QGridLayout()
        for i, b in enumerate(
            (
                self.new_button,
                self.add_button,
                self.index_button,
                self.cancel_button,
                self.model_button,
                self.remove_button,
            )
        ):
            buttons.addWidget(b, i // 2, i % 2)

        lay = QVBoxLayout(self)
        lay.addWidget(self.empty)
        lay.addWidget(self.list, 1)
        lay.addWidget(self.details)
        lay.addLayout(buttons)
        lay.addWidget(self.progress)
        lay.addWidget(self.status)
        lay.addStretch(0)

        self.job.progress.connect(self._on_progress)
        self.job.paused.connect(self._on_paused)
        self.job.finished.connect(self._on_finished)
        self.job.failed.connect(self._on_failed)
        self.refresh()

    # -- what is shown ---------------------------------------------------------------------

    def collections(self) -> list[Collection]:
        return self.store.collections()

    def refresh(self, select: str | None = None) -> None:
        """Read the collections again, keeping (or moving to) the selected one."""
        keep = select or self.selected_name()
        self.list.blockSignals(True)
        self.list.clear()
        cols = self.collections()
        for c in cols:
            counts = self.store.counts(c.name)
            item = QListWidgetItem(
                f"{c.name}\n{counts.indexed} files · {counts.chunks} chunks · {c.model_name}"
            )
            item.setData(Qt.ItemDataRole.UserRole, c.name)
            item.setToolTip("\n".join(str(r) for r in c.roots))
            self.list.addItem(item)
        names = [c.name for c in cols]
        if names:
            self.list.setCurrentRow(names.index(keep) if keep in names else 0)
        self.list.blockSignals(False)
        self.empty.setVisible(not cols)
        self.list.setVisible(bool(cols))
        self.details.setVisible(bool(cols))
        self._show_details()

    def selected_name(self) -> str | None:
        item = self.list.currentItem()
        return str(item.data(Qt.ItemDataRole.UserRole)) if item is not None else None

    def select(self, name: str) -> bool:
        for row in range(self.list.count()):
            if self.list.item(row).data(Qt.ItemDataRole.UserRole) == name:
                self.list.setCurrentRow(row)
                return True
        return False

    def _selected(self) -> Collection | None:
        name = self.selected_name()
        if name is None:
            return None
        try:
            return self.store.collection(name)
        except StoreError:  # removed by the command line meanwhile
            return None

    def _show_details(self) -> None:
        col = self._selected()
        if col is None:
            self._skipped = []
        else:
            counts = self.store.counts(col.name)
            self._skipped = self.store.skipped(col.name)
            self.details.setTitle(col.name)
            self.model_label.setText(col.model_name)
            self.model_label.setToolTip(col.model_path)
            self.folders_label.setText("\n".join(self._root_line(r) for r in col.roots))
            self.counts_label.setText(
                f"{counts.indexed} files · {counts.chunks} chunks · {counts.skipped} skipped"
            )
            self.when_label.setText(when(self.store.last_indexed(col.name)))
        self.skipped_button.setEnabled(bool(self._skipped))
        self._sync_buttons()

    @staticmethod
    def _root_line(root: Path) -> str:
        return str(root) if root.exists() else f"{root} (not found)"

    def _sync_buttons(self) -> None:
        running = self.job.running is not None
        has = self.selected_name() is not None
        for b in (self.add_button, self.index_button, self.model_button, self.remove_button):
            b.setEnabled(has and not running)
        self.cancel_button.setEnabled(running and not self.job.cancelling)

    def _say(self, text: str, *, error: bool = False) -> None:
        self.status.setStyleSheet(ERROR_STYLE if error else "")
        self.status.setText(text)

    # -- collections -----------------------------------------------------------------------

    def embedding_models(self) -> list[LibraryEntry]:
        return [e for e in self.library.entries() if e.error is None and embeds(e)]

    def new_collection(self) -> NewCollectionDialog:
        default = self.default_embedding
        dialog = NewCollectionDialog(
            self.embedding_models(),
            self.create_collection,
            pick_folder=self.pick_folder,
            pick_files=self.pick_files,
            default=default.path if default is not None else None,
            parent=self,
        )
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        return dialog

    def create_collection(self, name: str, roots: Sequence[Path], model: Path) -> str | None:
        """Create a collection (selected, not indexed yet); an error line, or None."""
        if not name:
            return "Give the collection a name."
        if not roots:
            return "Add at least one folder or file."
        missing = [p for p in roots if not p.exists()]
        if missing:
            return f"Not found: {missing[0]}"
        try:
            choice = self._choice(model)
            self.store.create_collection(
                name,
                [p.resolve() for p in roots],
                model_name=choice.name,
                model_path=str(choice.path),
                dim=choice.dim,
            )
        except (DocumentsError, StoreError) as e:
            return str(e)
        self.refresh(select=name)
        self._say(f"Created '{name}': Index reads its files.")
        return None

    def _is_default(self, model: Path) -> bool:
        d = self.default_embedding
        return d is not None and model.resolve() == d.path.resolve()

    def _choice(self, model: Path) -> EmbeddingChoice:
        """What a collection records of `model`; the default model's, before its file is
        made, from what the conversion writes."""
        if self._is_default(model) and not model.exists():
            return EmbeddingChoice(MODEL_NAME, model.resolve(), DIM)
        return embedding_choice(model)

    def _loader(self, load: EmbeddingLoader) -> EmbeddingLoader:
        """`load`, after making the default model's file when a collection needs it (on the
        indexing thread)."""

        def load_made(col: Collection) -> Embedding:
            d = self.default_embedding
            if d is not None and self._is_default(Path(col.model_path)):
                try:
                    d.ensure()
                except DefaultEmbeddingError as e:
                    raise DocumentsError(str(e)) from None
            return load(col)

        return load_made

    def add_folder(self, folders: Sequence[Path] | None = None) -> None:
        """Add folders to the selected collection (asked for when None); the next Index
        embeds their files only."""
        col = self._selected()
        if col is None or self.job.running is not None:
            return
        picked = list(self.pick_folder() if folders is None else folders)
        if not picked:
            return
        missing = [p for p in picked if not p.exists()]
        if missing:
            self._say(f"Not found: {missing[0]}", error=True)
            return
        new = [p.resolve() for p in picked if p.resolve() not in col.roots]
        if not new:
            self._say(f"'{col.name}' already has {picked[0]}.")
            return
        self.store.set_roots(col.name, [*col.roots, *new])
        self.refresh()
        self._say(f"Added {len(new)} folder(s) to '{col.name}': Index reads their files.")

    def change_model(self, model: Path | None = None) -> bool:
        """Give the selected collection another embedding model (asked for when None): its
        index is emptied, and the next Index embeds everything again."""
        col = self._selected()
        if col is None or self.job.running is not None:
            return False
        if model is None:
            choices = self.embedding_models()
            if not choices:
                self._say(NO_EMBEDDING_MODEL, error=True)
                return False
            picked = self.pick_model(choices, col.model_path)
            if picked is None:
                return False
            model = picked.path
        try:
            choice = self._choice(model)
        except DocumentsError as e:
            self._say(str(e), error=True)
            return False
        if str(choice.path) == col.model_path:
            self._say(f"'{col.name}' already uses {choice.name}.")
            return False
        if not self.confirm(
            "Change model",
            f"Embed '{col.name}' again with {choice.name}? Its index is emptied now and "
            "Index embeds every file again (vectors of two models do not compare).",
        ):
            return False
        self.store.set_model(
            col.name, model_name=choice.name, model_path=str(choice.path), dim=choice.dim
        )
        self.refresh()
        self._say(f"'{col.name}' now uses {choice.name}: Index embeds its files again.")
        return True

    def remove_selected(self) -> bool:
        col = self._selected()
        if col is None or self.job.running is not None:
            return False
        if not self.confirm(
            "Remove collection",
            f"Remove '{col.name}' and its index? Your files are not touched.",
        ):
            return False
        self.store.remove_collection(col.name)
        self.refresh()
        self._say(f"Removed '{col.name}' and its index; your files are untouched.")
        return True

    def show_skipped(self) -> SkippedDialog | None:
        name = self.selected_name()
        if name is None or not self._skipped:
            return None
        dialog = SkippedDialog(name, self._skipped, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        return dialog

    # -- indexing --------------------------------------------------------------------------

    def index_selected(self) -> bool:
        col = self._selected()
        if col is None or not self.job.start(col.name):
            return False
        self._paused = False
        self._last_progress = None
        missing = [r for r in col.roots if not r.exists()]
        self.progress.setRange(0, 0)  # busy until the walk has counted the files
        self.progress.show()
        note = f" ({missing[0]} is not found: its files stay indexed)" if missing else ""
        d = self.default_embedding
        if d is not None and self._is_default(Path(col.model_path)) and not d.ready():
            note += f" (first making {MODEL_NAME} from the installed package, once)"
        self._say(f"Indexing '{col.name}'…{note}")
        self._sync_buttons()
        return True

    def cancel(self) -> None:
        if self.job.running is None:
            return
        self.job.cancel()
        self._say(f"Cancelling '{self.job.running}' (it resumes next time)…")
        self._sync_buttons()

    def set_chat_busy(self, busy: bool) -> None:
        """The chat started or ended a reply: indexing holds while it answers."""
        self.gate.set_busy(busy)

    def _on_progress(self, name: str, p: IndexProgress) -> None:
        self._last_progress = p
        self.progress.setRange(0, max(1, p.files_total))
        self.progress.setValue(p.files_done)
        if not self._paused and not self.job.cancelling:
            self._say(f"Indexing '{name}': {progress_text(p)}")

    def _on_paused(self, name: str, paused: bool) -> None:
        self._paused = paused
        p = self._last_progress
        if paused:
            self._say(f"{PAUSED_TEXT} · '{name}' {progress_text(p) if p else ''}".rstrip())
        elif p is not None and not self.job.cancelling:
            self._say(f"Indexing '{name}': {progress_text(p)}")

    def _on_finished(self, name: str, report: IndexReport) -> None:
        self.progress.hide()
        self.refresh()
        self._say(report_text(name, report))

    def _on_failed(self, name: str, message: str) -> None:
        self.progress.hide()
        self.refresh()
        self._say(message, error=True)

    def shutdown(self) -> None:
        """Cancel indexing and wait for its thread (the next Index resumes)."""
        self.job.shutdown()
