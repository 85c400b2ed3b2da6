"""The model manager view: find GGUF models (and whisper.cpp speech models) on the Hub,
download them verified, manage the local library (delete/import), the speech-to-text model
(its box, speech_models_box), and the Hub token.

All Hub and disk work runs in the background (`app.ui.background`, two calls at a time);
results come back to the GUI thread. Download progress is polled from the DownloadManager on a
timer (300 ms), so the UI is never flooded however fast the bytes arrive. The services are
passed in:

    ModelManagerView(hub, downloads, library, tokens, confirm=None, pick_file=None)

`load_requested(Path)` asks the window to load a library model; `library_changed()` tells it
the library changed (download finished, import, delete).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from PySide6.QtCore import Qt, QTimer, Signal, Slot
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.services.download_jobs import (
    DONE,
    DOWNLOADING,
    FAILED,
    QUEUED,
    VERIFYING,
)
from app.services.download_manager import DownloadManager
from app.services.hub import HubClient, HubError, HubOffline, ModelVariant, RepoDetails, RepoSummary
from app.services.hub import SpeedBadge as Speed
from app.services.library import LibraryEntry, ModelLibrary
from app.services.secrets import TokenStore
from app.services.speech_models import SpeechLibrary
from app.ui.background import Background, Done
from app.ui.download_rows import progress_text, speed_text, status_text
from app.ui.library_model import is_embedding, not_for_chat, tagged_name
from app.ui.speech_models_box import SpeechModelsBox
from engine.model.gguf import human_bytes

log = logging.getLogger("candlewick.ui.models")

Confirm = Callable[[str, str], bool]  # (title, text) -> yes?
PickFile = Callable[[], tuple[Path, Literal["link", "copy"]] | None]
POLL_MS = 300


class _Note(QLabel):
    """A wrapped line of text that takes no room while it is empty."""

    def __init__(self) -> None:
        super().__init__()
        self.setText("")

    def setText(self, text: str) -> None:
        super().setText(text)
        self.setVisible(bool(text))


class ModelManagerView(QWidget):
    load_requested = Signal(object)  # Path
    library_changed = Signal()
    status_changed = Signal(str)
    # A job changed on a download thread: one a server's pull added shows up too.
    job_changed = Signal()

    def __init__(
        self,
        hub: HubClient,
        downloads: DownloadManager,
        library: ModelLibrary,
        tokens: TokenStore,
        *,
        confirm: Confirm | None = None,
        pick_file: PickFile | None = None,
        speech: SpeechLibrary | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.hub, self.downloads, self.library, self.tokens = hub, downloads, library, tokens
        # whisper.cpp's models: downloaded through the same manager, listed apart.
        hf = library.discovery.hf_cache if library.discovery else None
        self.speech_library = speech or SpeechLibrary(library.models_dir, hf_cache=hf)
        self._confirm = confirm or self._ask
        self._pick_file = pick_file or self._pick
        # Two at a time: a repository's fit badges are a Hub request per file.
        self._bg = Background(self, max_threads=2)
        self._details: RepoDetails | None = None
        self._results: list[RepoSummary] = []
        self._entries: list[LibraryEntry] = []
        self._job_status: dict[str, str] = {}
        self._closed = False
        self._build()
        self._timer = QTimer(self)
        self._timer.setInterval(POLL_MS)
        self._timer.timeout.connect(self.refresh_downloads)
        self.job_changed.connect(self._on_job_changed, Qt.ConnectionType.QueuedConnection)
        self._unsubscribe = downloads.subscribe(lambda _job: self.job_changed.emit())
        self.refresh_downloads()
        self.refresh_library()
        self._show_token_state()

    # --- layout -------------------------------------------------------------------------------

    def _build(self) -> None:
        self.query = QLineEdit()
        self.query.setPlaceholderText("Search the Hugging Face Hub for GGUF models")
        self.query.setAccessibleName("Hub search")
        self.query.returnPressed.connect(self.search)
        self.sort = QComboBox()
        self.sort.addItem("Most downloaded", "downloads")
        self.sort.addItem("Most liked", "likes")
        self.sort.addItem("Recently updated", "updated")
        self.speech_search = QCheckBox("Speech to text")
        self.speech_search.setToolTip("Find whisper.cpp models (speech recognition) instead")
        self.search_button = QPushButton("Search")
        self.search_button.clicked.connect(self.search)
        self.hub_status = _Note()
        self.hub_status.setWordWrap(True)
        self.results = _table(["Repository", "Downloads", "Likes", "Updated"])
        self.results.itemSelectionChanged.connect(self._on_result_selected)
        self.repo_info = _Note()
        self.repo_info.setWordWrap(True)
        # Speed: predicted here from the header the fit reads; measured too once used.
        self.files = _table(["File", "Quantization", "Size", "Fit", "Speed"])
        self.download_button = QPushButton("Download")
        self.download_button.setEnabled(False)
        self.download_button.clicked.connect(self.download_selected)
        self.files.itemSelectionChanged.connect(
            lambda: self.download_button.setEnabled(self._selected_variant() is not None)
        )

        search_row = QHBoxLayout()
        search_row.addWidget(self.query, 1)
        search_row.addWidget(self.sort)
        search_row.addWidget(self.speech_search)
        search_row.addWidget(self.search_button)
        hub_box = QGroupBox("Hugging Face Hub")
        hub_layout = QVBoxLayout(hub_box)
        hub_layout.addLayout(search_row)
        hub_layout.addWidget(self.hub_status)
        # Results above the repository's files: side by side, in a side panel, each was too
        # narrow for its columns.
        split = QSplitter(Qt.Orientation.Vertical)
        split.setChildrenCollapsible(False)
        split.addWidget(self.results)
        below = QWidget()
        below_layout = QVBoxLayout(below)
        below_layout.setContentsMargins(0, 0, 0, 0)
        below_layout.addWidget(self.repo_info)
        below_layout.addWidget(self.files, 1)
        below_layout.addWidget(self.download_button)
        split.addWidget(below)
        hub_layout.addWidget(split, 1)

        self.jobs = _table(["File", "Status", "Progress", "Speed / ETA"], rows=2)
        self.pause_button = QPushButton("Pause")
        self.resume_button = QPushButton("Resume")
        self.cancel_button = QPushButton("Cancel")
        self.pause_button.clicked.connect(lambda: self._on_job(self.downloads.pause))
        self.resume_button.clicked.connect(lambda: self._on_job(self.downloads.resume))
        self.cancel_button.clicked.connect(lambda: self._on_job(self.downloads.cancel))
        jobs_box = QGroupBox("Downloads")
        jobs_layout = QVBoxLayout(jobs_box)
        jobs_layout.addWidget(self.jobs, 1)
        row = QHBoxLayout()
        for b in (self.pause_button, self.resume_button, self.cancel_button):
            row.addWidget(b)
        row.addStretch(1)
        jobs_layout.addLayout(row)

        self.local = _table(
            ["Model", "Source", "Quantization", "Size", "File"], rows=2, stretch=(0, 4)
        )  # the name and the file name share what is left
        self.load_button = QPushButton("Load")
        self.delete_button = QPushButton("Delete…")
        # Short labels: the row must fit the window's narrowest side panel (1000x700).
        self.import_button = QPushButton("Import…")
        self.import_button.setToolTip("Import a .gguf file")
        self.load_button.clicked.connect(self._load_selected)
        self.delete_button.clicked.connect(self.delete_selected)
        self.import_button.clicked.connect(self.import_file)
        # A folder: every model in it, each with the projector (mmproj) beside it.
        self.import_folder_button = QPushButton("Import folder…")
        self.import_folder_button.setToolTip("Import every model in a folder, with its projector")
        self.import_folder_button.clicked.connect(self.import_folder)
        self.library_status = _Note()
        self.library_status.setWordWrap(True)
        lib_box = QGroupBox("On this computer")
        lib_layout = QVBoxLayout(lib_box)
        lib_layout.addWidget(self.local, 1)
        row2 = QHBoxLayout()
        for b in (
            self.load_button,
            self.delete_button,
            self.import_button,
            self.import_folder_button,
        ):
            row2.addWidget(b)
        row2.addStretch(1)
        lib_layout.addLayout(row2)
        lib_layout.addWidget(self.library_status)

        self.token = QLineEdit()
        self.token.setEchoMode(QLineEdit.EchoMode.Password)
        self.token.setPlaceholderText("hf_… (for gated or private repositories)")
        self.token.setAccessibleName("Hub access token")
        self.save_token_button = QPushButton("Save token")
        self.clear_token_button = QPushButton("Forget token")
        self.save_token_button.clicked.connect(self.save_token)
        self.clear_token_button.clicked.connect(self.clear_token)
        self.token_status = QLabel("")
        self.token_status.setWordWrap(True)
        token_box = QGroupBox("Hub access token")
        token_layout = QVBoxLayout(token_box)
        row3 = QHBoxLayout()
        row3.addWidget(self.token, 1)
        row3.addWidget(self.save_token_button)
        row3.addWidget(self.clear_token_button)
        token_layout.addLayout(row3)
        token_layout.addWidget(self.token_status)

        self.speech = SpeechModelsBox(self.speech_library, self._run, self._confirm)
        outer = QSplitter(Qt.Orientation.Vertical)
        outer.setChildrenCollapsible(False)  # a table never shrinks below its few rows
        boxes = ((hub_box, 3), (jobs_box, 1), (lib_box, 2), (self.speech, 1))
        for i, (box, stretch) in enumerate(boxes):
            outer.addWidget(box)
            outer.setStretchFactor(i, stretch)
        layout = QVBoxLayout(self)
        layout.addWidget(outer, 1)
        layout.addWidget(token_box)

    # --- background calls ---------------------------------------------------------------------

    def _run(self, fn: Callable[[], Any], then: Done) -> None:
        if not self._closed:
            self._bg.run(fn, then, name="candlewick-model-manager")

    @property
    def busy(self) -> bool:
        return bool(self._bg.running)

    # --- Hub ----------------------------------------------------------------------------------

    @Slot()
    def search(self) -> None:
        text = self.query.text().strip()
        sort, speech = self.sort.currentData(), self.speech_search.isChecked()
        self.hub_status.setText("Searching…")
        self.search_button.setEnabled(False)
        self._run(lambda: self.hub.search(text, sort=sort, speech=speech), self._show_results)

    def _show_results(self, results: list[RepoSummary] | None, error: BaseException | None) -> None:
        self.search_button.setEnabled(True)
        if error is not None:
            self._hub_error(error)
            return
        self._results = results or []
        self.results.setRowCount(0)
        for r in self._results:
            _append(
                self.results,
                [
                    r.repo_id + ("  (gated)" if r.gated else ""),
                    f"{r.downloads:,}",
                    f"{r.likes:,}",
                    (r.last_modified or "")[:10],
                ],
            )
        self.hub_status.setText(
            f"{len(self._results)} repositories" if self._results else "No GGUF repositories match."
        )

    def _hub_error(self, error: BaseException) -> None:
        if isinstance(error, HubOffline):
            self.hub_status.setText(f"Offline — {error}. Your local models still work.")
        elif isinstance(error, HubError):
            self.hub_status.setText(str(error))
        else:
            log.error("hub call failed", exc_info=error)
            self.hub_status.setText(f"Unexpected error: {type(error).__name__}: {error}")
        self.status_changed.emit(self.hub_status.text())

    def _on_result_selected(self) -> None:
        rows = {i.row() for i in self.results.selectedIndexes()}
        if len(rows) != 1:
            return
        repo = self._results[rows.pop()].repo_id
        self.open_repo(repo)

    def open_repo(self, repo_id: str) -> None:
        self.files.setRowCount(0)
        self.repo_info.setText(f"Loading {repo_id}…")
        self._run(lambda: self.hub.repo_details(repo_id, with_fit=False), self._show_files)

    def _show_files(self, details: RepoDetails | None, error: BaseException | None) -> None:
        if error is not None or details is None:
            self.repo_info.setText("")
            self._hub_error(error or HubError("no answer"))
            return
        self._details = details
        lines = [f"<b>{details.repo_id}</b> — license: {details.license or 'not stated'}"]
        if details.gated:
            lines.append("Gated: accept its conditions on the Hub and save a token below.")
        if details.summary:
            lines.append(details.summary)
        self.repo_info.setText("<br>".join(_escape(x) if i else x for i, x in enumerate(lines)))
        self.files.setRowCount(0)
        for v in details.variants:
            name = v.name + (f"  ({len(v.files)} parts)" if len(v.files) > 1 else "")
            if not v.complete:
                name += f"  — {v.shards_expected - len(v.files)} parts missing"
            fit = (
                "…"
                if v.kind == "model" and self.hub.fit
                else {"projector": "vision projector", "speech": "speech to text"}.get(v.kind, "")
            )
            speed = "…" if v.kind == "model" and self.hub.speed else ""
            _append(
                self.files,
                [name, v.quantization, human_bytes(v.size), fit, speed],
                tips=[None, None, f"{v.size:,} bytes", None, None],
            )
        if not details.variants:
            self.repo_info.setText(self.repo_info.text() + "<br>No GGUF files here.")
        repo, commit, partial = details.repo_id, details.commit or "main", functools.partial
        for row, v in enumerate(details.variants):
            if v.kind == "model" and self.hub.fit is not None:
                self._run(
                    partial(self.hub.fit_badge, repo, v, commit),
                    partial(self._show_fit, details, row),
                )
            if v.kind == "speech":  # whisper.cpp's memory, from the file's first bytes
                self._run(
                    partial(self.hub.speech_fit, repo, commit, v),
                    partial(self._show_fit, details, row),
                )
            if v.kind == "model" and self.hub.speed is not None:
                self._run(
                    partial(self.hub.speed_badge, repo, v, commit),
                    partial(self._show_speed, details, row),
                )

    def _show_fit(
        self, details: RepoDetails, row: int, badge: str | None, error: BaseException | None
    ) -> None:
        if details is not self._details or row >= self.files.rowCount():
            return  # another repository is shown now
        text = badge if error is None and badge else "unknown"
        text = f"speech to text · {text}" if details.variants[row].kind == "speech" else text
        details.fits[details.variants[row].name] = text
        self.files.setItem(row, 3, _item(text))

    def _show_speed(
        self, details: RepoDetails, row: int, badge: Speed | None, error: BaseException | None
    ) -> None:
        if details is not self._details or row >= self.files.rowCount():
            return  # another repository is shown now
        if error is not None or badge is None:
            self.files.setItem(row, 4, _item("unknown"))
            return
        details.speeds[details.variants[row].name] = badge
        self.files.setItem(row, 4, _item(badge.text, badge.tooltip))

    def _selected_variant(self) -> ModelVariant | None:
        rows = {i.row() for i in self.files.selectedIndexes()}
        if self._details is None or len(rows) != 1:
            return None
        row = rows.pop()
        return self._details.variants[row] if row < len(self._details.variants) else None

    @Slot()
    def download_selected(self) -> None:
        v, d = self._selected_variant(), self._details
        if v is None or d is None:
            return
        if not v.complete:
            self.hub_status.setText(f"{v.name} is missing parts on the Hub: it cannot be used.")
            return
        for f in v.files:
            try:
                self.downloads.add(
                    d.repo_id, f.filename, sha256=f.sha256, size=f.size, commit=d.commit
                )
            except HubError as e:
                self.hub_status.setText(str(e))
                return
        self.refresh_downloads()

    # --- downloads ----------------------------------------------------------------------------

    def _selected_job(self) -> str | None:
        rows = {i.row() for i in self.jobs.selectedIndexes()}
        if len(rows) != 1:
            return None
        item = self.jobs.item(rows.pop(), 0)
        return str(item.data(Qt.ItemDataRole.UserRole)) if item else None

    def _on_job(self, action: Callable[[str], None]) -> None:
        job_id = self._selected_job()
        if job_id is not None:
            action(job_id)
            self.refresh_downloads()

    @Slot()
    def _on_job_changed(self) -> None:
        """The list follows a job it did not start; its timer takes over while one runs."""
        if not self._closed and not self._timer.isActive():
            self.refresh_downloads()

    @Slot()
    def refresh_downloads(self) -> None:
        jobs = self.downloads.jobs()
        selected = self._selected_job()
        self.jobs.setRowCount(0)
        finished = False
        for j in jobs:
            _append(
                self.jobs,
                [j.filename, status_text(j), progress_text(j), speed_text(j)],
                tips=[f"{j.repo_id}/{j.filename}", j.error or j.note, None, None],
                data=j.id,
            )
            if j.status == DONE and self._job_status.get(j.id) not in (None, DONE):
                finished = True
        for row, j in enumerate(jobs):
            if j.id == selected:
                self.jobs.selectRow(row)
        failed_now = [
            j
            for j in jobs
            if j.status == FAILED and self._job_status.get(j.id) not in (None, FAILED)
        ]
        self._job_status = {j.id: j.status for j in jobs}
        if failed_now and failed_now[-1].error:
            self.hub_status.setText(failed_now[-1].error)
            self.status_changed.emit(failed_now[-1].error)
        active = any(j.status in (QUEUED, DOWNLOADING, VERIFYING) for j in jobs)
        if active and not self._timer.isActive() and not self._closed:
            self._timer.start()
        elif not active and self._timer.isActive():
            self._timer.stop()
        if finished:
            self.refresh_library()
            self.library_changed.emit()

    # --- library ------------------------------------------------------------------------------

    @Slot()
    def refresh_library(self) -> None:
        self._entries = self.library.entries()
        self.local.setRowCount(0)
        for e in self._entries:
            f = e.facts
            source = "imported (link)" if e.linked else e.source
            _append(
                self.local,
                [
                    e.id if f is None else f"{tagged_name(e)}  [{e.id}]",
                    source,
                    f.quantization if f else "unusable",
                    human_bytes(f.file_bytes) if f else "-",
                    e.label or e.path.name,
                ],
                tips=[str(e.path), e.owner, e.error, None, None],
                data=e.id,
            )
        self.speech.refresh()

    def _selected_entry(self) -> LibraryEntry | None:
        rows = {i.row() for i in self.local.selectedIndexes()}
        if len(rows) != 1:
            return None
        row = rows.pop()
        return self._entries[row] if row < len(self._entries) else None

    def select_library_entry(self, entry_id: str) -> bool:
        for row, e in enumerate(self._entries):
            if e.id == entry_id:
                self.local.selectRow(row)
                return True
        return False

    def _load_selected(self) -> None:
        e = self._selected_entry()
        if e is None:
            return
        if e.facts is None:
            self.library_status.setText(f"{e.id} cannot be loaded: {e.error}")
            return
        if is_embedding(e):
            self.library_status.setText(not_for_chat(e))
            return
        self.load_requested.emit(e.path)

    @Slot()
    def delete_selected(self) -> None:
        e = self._selected_entry()
        if e is None:
            return
        try:
            plan = self.library.plan_delete(e.id)
        except Exception as err:  # LibraryError: bundled, Ollama's files
            self.library_status.setText(str(err))
            return
        text = f"Delete {e.label or e.path.name}? This frees {human_bytes(plan.freed_bytes)}."
        if plan.warning:
            text += f"\n\n{plan.warning}."
        if not self._confirm("Delete model", text):
            return
        try:
            done = self.library.delete(e.id, allow_foreign=True)
        except OSError as err:
            self.library_status.setText(f"Could not delete {e.path.name}: {err.strerror or err}")
            return
        if e.source == "downloaded":
            self.downloads.forget_path(e.path)
        self.library_status.setText(f"Deleted {e.id}: {human_bytes(done.freed_bytes)} freed")
        self.refresh_library()
        self.refresh_downloads()
        self.library_changed.emit()

    @Slot()
    def import_file(self) -> None:
        choice = self._pick_file()
        if choice is None:
            return
        path, mode = choice
        self.library_status.setText(f"Importing {path.name}…")
        self._run(lambda: self.library.import_file(path, mode=mode), self._imported)

    @Slot()
    def import_folder(self) -> None:
        name = QFileDialog.getExistingDirectory(self, "Import the models in a folder")
        if not name:
            return
        folder = Path(name)
        self.library_status.setText(f"Importing the models in {folder.name}…")
        self._run(lambda: self.library.import_folder(folder), self._imported_folder)

    def _imported_folder(
        self, entries: list[LibraryEntry] | None, error: BaseException | None
    ) -> None:
        if error is not None or not entries:
            self.library_status.setText(f"Not imported: {error}")
            return
        paired = sum(1 for e in entries if e.capabilities)
        self.library_status.setText(
            f"Imported {len(entries)} model{'s' if len(entries) != 1 else ''}"
            + (f", {paired} with a projector" if paired else "")
        )
        self.refresh_library()
        self.library_changed.emit()

    def _imported(self, entry: LibraryEntry | None, error: BaseException | None) -> None:
        if error is not None or entry is None:
            self.library_status.setText(f"Not imported: {error}")
            return
        self.library_status.setText(f"Imported {entry.path.name} as {entry.id}")
        self.refresh_library()
        self.library_changed.emit()

    # --- token --------------------------------------------------------------------------------

    def _show_token_state(self) -> None:
        has = self.tokens.get() is not None
        storage = self.tokens.describe_storage()
        self.token_status.setText(("A token is set; " if has else "No token set; ") + storage)

    @Slot()
    def save_token(self) -> None:
        try:
            result = self.tokens.set(self.token.text())
        except ValueError as e:
            self.token_status.setText(str(e))
            return
        finally:
            self.token.clear()  # the field never keeps the secret around
        self.token_status.setText(result.message)

    @Slot()
    def clear_token(self) -> None:
        self.tokens.clear()
        self.token.clear()
        self._show_token_state()

    # --- dialogs (replaced in tests) ----------------------------------------------------------

    def _ask(self, title: str, text: str) -> bool:
        answer = QMessageBox.question(self, title, text)
        return answer == QMessageBox.StandardButton.Yes

    def _pick(self) -> tuple[Path, Literal["link", "copy"]] | None:
        name, _ = QFileDialog.getOpenFileName(
            self, "Import a GGUF model", "", "GGUF models (*.gguf);;All files (*)"
        )
        if not name:
            return None
        box = QMessageBox(self)
        box.setWindowTitle("Import")
        box.setText("Use the file where it is, or copy it into Candlewick's folder?")
        link = box.addButton("Use in place", QMessageBox.ButtonRole.AcceptRole)
        box.addButton("Copy", QMessageBox.ButtonRole.AcceptRole)
        box.exec()
        return Path(name), "link" if box.clickedButton() is link else "copy"

    # --- shutdown -----------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop the timer and background calls; the DownloadManager is closed by its owner."""
        self._closed = True
        self._unsubscribe()
        self._timer.stop()
        self._bg.wait(timeout_s=None)  # an import may be copying a file: let it finish


def _table(headers: list[str], rows: int = 3, stretch: tuple[int, ...] = (0,)) -> QTableWidget:
    """A read-only table that fits its view's width: the `stretch` columns share what the
    others (as wide as their header and cells) leave, eliding their text; it is never
    shorter than its header and `rows` rows."""
    t = QTableWidget(0, len(headers))
    t.setHorizontalHeaderLabels(headers)
    t.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    t.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    t.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    t.setWordWrap(False)
    t.setTextElideMode(Qt.TextElideMode.ElideMiddle)
    rows_header = t.verticalHeader()
    rows_header.setVisible(False)
    rows_header.setMinimumSectionSize(1)
    rows_header.setDefaultSectionSize(t.fontMetrics().height() + 8)  # single-line rows
    header = t.horizontalHeader()
    header.setStretchLastSection(False)
    for col in range(len(headers)):
        header.setSectionResizeMode(
            col,
            QHeaderView.ResizeMode.Stretch
            if col in stretch
            else QHeaderView.ResizeMode.ResizeToContents,
        )
    t.setMinimumHeight(
        header.sizeHint().height() + rows * rows_header.defaultSectionSize() + 2 * t.frameWidth()
    )
    return t


def _item(text: str, tip: str | None = None, data: str | None = None) -> QTableWidgetItem:
    it = QTableWidgetItem(text)
    if tip:
        it.setToolTip(tip)
    if data is not None:
        it.setData(Qt.ItemDataRole.UserRole, data)
    return it


def _append(
    table: QTableWidget,
    cells: list[str],
    *,
    tips: list[str | None] | None = None,
    data: str | None = None,
) -> None:
    row = table.rowCount()
    table.insertRow(row)
    for col, text in enumerate(cells):
        tip = tips[col] if tips else None
        table.setItem(row, col, _item(text, tip, data if col == 0 else None))


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
