"""Light, dark or the system's colours (View → Appearance).

"System" leaves the palette to the platform theme (and the `QT_*` style variables), as the
app always did; "Light" and "Dark" ask the platform for that colour scheme and, because some
platforms (and the offscreen one) have no theme that answers, set a palette of that scheme
too. Every widget reads its colours from the palette, so switching repaints the window in
place: the code highlighting, the chart and the rail's icons follow `PaletteChange`.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

SCHEMES = ("system", "light", "dark")
SETTINGS_KEY = "view/scheme"

# A dark desktop's palette, as a dark platform theme hands it to Qt.
DARK = {
    QPalette.ColorRole.Window: "#2b2b2e",
    QPalette.ColorRole.WindowText: "#e6e6e6",
    QPalette.ColorRole.Base: "#1e1e20",
    QPalette.ColorRole.AlternateBase: "#2f2f33",
    QPalette.ColorRole.Text: "#e6e6e6",
    QPalette.ColorRole.PlaceholderText: "#8e8e93",
    QPalette.ColorRole.Button: "#35353a",
    QPalette.ColorRole.ButtonText: "#e6e6e6",
    QPalette.ColorRole.BrightText: "#ff6b6b",
    QPalette.ColorRole.Highlight: "#3d6fb4",
    QPalette.ColorRole.HighlightedText: "#ffffff",
    QPalette.ColorRole.ToolTipBase: "#35353a",
    QPalette.ColorRole.ToolTipText: "#e6e6e6",
    QPalette.ColorRole.Link: "#7fb2ff",
    QPalette.ColorRole.Mid: "#4a4a50",
    QPalette.ColorRole.Midlight: "#3f3f44",
    QPalette.ColorRole.Dark: "#1a1a1c",
    QPalette.ColorRole.Shadow: "#000000",
    QPalette.ColorRole.Light: "#4a4a50",
}


def dark_palette() -> QPalette:
    p = QPalette()
    for role, colour in DARK.items():
        p.setColor(role, QColor(colour))
    for role in (
        QPalette.ColorRole.WindowText,
        QPalette.ColorRole.Text,
        QPalette.ColorRole.ButtonText,
    ):
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor("#7a7a80"))
    return p


def light_palette() -> QPalette:
    """Qt's own light palette (Fusion's), whatever the platform theme says."""
    from PySide6.QtWidgets import QStyleFactory

    style = QStyleFactory.create("Fusion")
    return style.standardPalette() if style is not None else QPalette()


_system_palette: QPalette | None = None


def apply_scheme(scheme: str) -> None:
    """Use `scheme` ('system', 'light' or 'dark') for the whole application."""
    global _system_palette
    app = QApplication.instance()
    if not isinstance(app, QApplication):
        return
    if _system_palette is None:
        _system_palette = QPalette(QApplication.palette())
    hints = QGuiApplication.styleHints()
    wanted = {
        "light": Qt.ColorScheme.Light,
        "dark": Qt.ColorScheme.Dark,
    }.get(scheme, Qt.ColorScheme.Unknown)
    if hasattr(hints, "setColorScheme"):  # Qt 6.8: the platform's own light or dark
        hints.setColorScheme(wanted)
    if scheme == "dark":
        QApplication.setPalette(dark_palette())
    elif scheme == "light":
        QApplication.setPalette(light_palette())
    else:
        QApplication.setPalette(_system_palette)
