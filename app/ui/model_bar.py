"""The model bar at the top of the chat: which library model the chat uses, whether it fits,
what else it reads, its load state, and Load / Cancel / Eject, as chat apps put it above
the conversation. The load settings live on the Models page ("Load settings…" goes there).

The bar decides nothing: picking a model asks the window to select (and load) it in the
library, whose selection the chat's controller reads; the buttons ask the window, which
goes through the library panel as its own buttons do. The fit badge is the memory estimate
of the library's selected model with the library's load settings (the same estimator).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QEvent, QSize, Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QToolButton,
    QWidget,
)

from app.services.library import LibraryEntry
from app.services.speed_records import SpeedView
from app.ui.estimate import EstimateView, Estimator
from app.ui.library_model import LibraryModel, is_embedding, tagged_name
from app.ui.nav_rail import ICON, rail_icon
from engine.settings import LoadParams

# Over this share of the free RAM a model "fits" but leaves little for everything else.
TIGHT_SHARE = 0.8
# Badge text and colours (readable on light and dark palettes: white text on a mid hue).
BADGES = {
    "fits": ("fits", "#2e7d32"),
    "tight": ("tight", "#b26a00"),
    "no": ("won't fit", "#c62828"),
}
CAPABILITY_COLOUR = "#3d6fb4"
SPEED_COLOUR = "#5d6d7e"
# A model file -> its predicted (and measured) decode speed; None when nothing is known.
SpeedSource = Callable[[Path], SpeedView | None]


def fit_badge(est: EstimateView | None) -> str | None:
    """'fits', 'tight' or 'no' (won't fit) for an estimate; None without one."""
    if est is None:
        return None
    if est.verdict == "no":
        return "no"
    if est.verdict == "partial":
        return "tight"
    if est.free_ram and (est.ram + est.prompt_cache) > TIGHT_SHARE * est.free_ram:
        return "tight"
    return "fits"


def _badge(text: str, colour: str, name: str) -> QLabel:
    label = QLabel(text)
    label.setAccessibleName(name)
    label.setStyleSheet(
        f"QLabel {{ background: {colour}; color: white; border-radius: 4px; padding: 1px 6px; }}"
    )
    return label


class ModelBar(QWidget):
    model_chosen = Signal(str)  # a library entry's id, picked by the user
    load_requested = Signal()
    cancel_requested = Signal()
    eject_requested = Signal()
    settings_requested = Signal()  # "Load settings…"

    def __init__(
        self,
        model: LibraryModel,
        estimator: Estimator | None,
        params: Callable[[], LoadParams],
        parent: QWidget | None = None,
    ) -> None:
        """`model`: the library's entries; `params`: the library's load settings now."""
        super().__init__(parent)
        self.setObjectName("modelBar")
        self.model = model
        self.estimator = estimator
        self._params = params
        self._selected: LibraryEntry | None = None
        self._loading = False
        self._loaded_path: object = None
        self._state_text = ""
        self.combo = QComboBox()
        self.combo.setAccessibleName("Model")
        self.combo.setToolTip("The library model this chat uses; picking one loads it")
        self.combo.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )
        self.combo.setMinimumContentsLength(16)
        self.combo.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.combo.activated.connect(self._activated)
        self.fit = _badge("", BADGES["fits"][1], "Memory fit")
        # Beside the fit: the decode speed predicted on this machine, and measured once used.
        self.speed = _badge("", SPEED_COLOUR, "Decode speed")
        self.speed.hide()
        self._speed_source: SpeedSource | None = None
        self.capabilities = QLabel()
        self.capabilities.setAccessibleName("Reads besides text")
        self.state = QLabel("Not loaded")
        self.state.setAccessibleName("Model state")
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.progress.setTextVisible(False)
        self.progress.setFixedWidth(80)
        self.progress.setAccessibleName("Loading progress")
        self.progress.hide()
        self.load_button = QPushButton("Load")
        self.load_button.setAccessibleName("Load model")
        self.load_button.clicked.connect(self.load_requested)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setAccessibleName("Cancel loading")
        self.cancel_button.clicked.connect(self.cancel_requested)
        self.eject_button = QPushButton("Eject")
        self.eject_button.setAccessibleName("Eject model")
        self.eject_button.setToolTip("Unload the model and free its memory")
        self.eject_button.clicked.connect(self.eject_requested)
        # An icon: a row with the model's name, badges and buttons fits a 1000 px window
        # with the settings drawer open.
        self.settings_button = QToolButton()
        self.settings_button.setText("Load settings…")
        self.settings_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonIconOnly)
        self.settings_button.setIconSize(QSize(ICON, ICON))
        self.settings_button.setAutoRaise(True)
        self.settings_button.setAccessibleName("Load settings")
        self.settings_button.setToolTip(
            "Context length, GPU layers, cache types and the memory estimate (Models page)"
        )
        self.settings_button.clicked.connect(self.settings_requested)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.combo, 1)
        lay.addWidget(self.fit)
        lay.addWidget(self.speed)
        lay.addWidget(self.capabilities)
        lay.addWidget(self.state)
        lay.addWidget(self.progress)
        for b in (self.load_button, self.cancel_button, self.eject_button, self.settings_button):
            lay.addWidget(b)
        self._paint_icon()
        model.modelReset.connect(self.rebuild)
        self.rebuild()

    def _paint_icon(self) -> None:
        colour = self.palette().color(self.foregroundRole())
        self.settings_button.setIcon(rail_icon("models", colour, self.devicePixelRatioF()))

    def changeEvent(self, e: QEvent) -> None:
        if e.type() == QEvent.Type.PaletteChange:  # light <-> dark: the icon in the new colour
            self._paint_icon()
        super().changeEvent(e)

    # -- contents ----------------------------------------------------------------------------

    def entries(self) -> list[LibraryEntry]:
        """The models the chat can use: the library's, less embedding models and rerankers."""
        rows = (self.model.entry(r) for r in range(self.model.rowCount()))
        return [e for e in rows if not is_embedding(e)]

    def rebuild(self) -> None:
        self.combo.blockSignals(True)
        self.combo.clear()
        for e in self.entries():
            name = tagged_name(e) if e.error is None else f"{e.path.name} — unreadable"
            self.combo.addItem(name, e.id)
            if e.error is not None:
                item = self.combo.model().index(self.combo.count() - 1, 0)
                self.combo.model().setData(item, e.error, Qt.ItemDataRole.ToolTipRole)
        self.combo.blockSignals(False)
        self.set_selected(self._selected)

    def set_selected(self, entry: LibraryEntry | None) -> None:
        """The library's selection changed (or its settings): show it and its badges."""
        self._selected = entry
        i = self.combo.findData(entry.id) if entry is not None else -1
        self.combo.blockSignals(True)
        self.combo.setCurrentIndex(i)
        self.combo.blockSignals(False)
        self.refresh_fit()
        self.refresh_speed()
        caps = entry.capabilities if entry is not None else ()
        self.capabilities.setText(
            " ".join(
                f"<span style='background:{CAPABILITY_COLOUR}; color:white'>&nbsp;{c}&nbsp;</span>"
                for c in caps
            )
        )
        self.capabilities.setToolTip(
            "This model reads " + " and ".join(caps) + " through its projector" if caps else ""
        )
        self.capabilities.setVisible(bool(caps))
        self._sync()

    def refresh_fit(self) -> None:
        """Recompute the fit badge (the library's load settings may have changed)."""
        entry = self._selected
        est = None
        if entry is not None and entry.error is None and self.estimator is not None:
            try:
                est = self.estimator(entry.path, self._params())
            except (OSError, ValueError, RuntimeError, LookupError):
                est = None  # the Models page says why
        badge = fit_badge(est)
        self.fit.setVisible(badge is not None)
        if badge is not None and est is not None:
            text, colour = BADGES[badge]
            self.fit.setText(text)
            self.fit.setStyleSheet(
                f"QLabel {{ background: {colour}; color: white; border-radius: 4px;"
                " padding: 1px 6px; }"
            )
            self.fit.setToolTip(est.reason or f"Needs about {est.total / 2**20:,.0f} MiB")

    def set_speed_source(self, source: SpeedSource | None) -> None:
        self._speed_source = source
        self.refresh_speed()

    def refresh_speed(self) -> None:
        """Show the selected model's predicted and measured decode speed, when known."""
        entry, source = self._selected, self._speed_source
        view = None
        if entry is not None and entry.error is None and source is not None:
            try:
                view = source(entry.path)
            except (OSError, ValueError, RuntimeError, LookupError):
                view = None  # an unreadable file: the fit badge and the Models page say why
        text = view.text() if view is not None else ""
        self.speed.setText(text)
        self.speed.setToolTip(view.tooltip() if view is not None else "")
        self.speed.setVisible(bool(text))

    # -- load state --------------------------------------------------------------------------

    def set_loading(self, loading: bool) -> None:
        self._loading = loading
        if loading:
            self.progress.setValue(0)
        self._sync()

    def set_progress(self, fraction: float) -> None:
        self.progress.setValue(round(fraction * 100))

    def set_loaded(self, path: object, text: str) -> None:
        """A model is loaded (`path`, None: none is); `text`: its state line."""
        self._loading = False
        self._loaded_path = path
        self._state_text = text
        self._sync()

    def _sync(self) -> None:
        entry = self._selected
        loaded_here = entry is not None and entry.path == self._loaded_path
        if self._loading:
            self.state.setText("Loading…")
        else:
            self.state.setText(self._state_text or ("Not loaded" if entry else "No model"))
        self.state.setToolTip(
            "" if self._loading or self._loaded_path is not None else "It loads when you send"
        )
        self.progress.setVisible(self._loading)
        self.cancel_button.setVisible(self._loading)
        # One of Load / Cancel / Eject at a time: the bar stays one row in a small window.
        self.load_button.setVisible(not self._loading and not loaded_here)
        self.load_button.setEnabled(entry is not None and entry.error is None)
        self.eject_button.setVisible(not self._loading and loaded_here)

    def _activated(self, index: int) -> None:
        entry_id = self.combo.itemData(index)
        if isinstance(entry_id, str):
            self.model_chosen.emit(entry_id)
