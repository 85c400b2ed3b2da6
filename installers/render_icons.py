"""Render the application icon set from resources/icons/candlewick.svg.

Writes PNGs in the freedesktop sizes, a Windows .ico and a macOS .icns next to the SVG. The ICO
and ICNS containers are written here (PNG-compressed entries, which both formats accept) so the
result does not depend on which Qt image plugins are installed.

    .venv/bin/python installers/render_icons.py
"""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

ICONS = Path(__file__).resolve().parent.parent / "resources" / "icons"
SVG = ICONS / "candlewick.svg"
PNG_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)
ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)
# ICNS entry types holding PNG data, by pixel size (Apple's icns element types).
ICNS_TYPES = (
    (b"icp4", 16),
    (b"icp5", 32),
    (b"icp6", 64),
    (b"ic07", 128),
    (b"ic08", 256),
    (b"ic09", 512),
    (b"ic11", 32),
    (b"ic12", 64),
    (b"ic13", 256),
    (b"ic14", 512),
)


def png_name(size: int) -> str:
    return f"candlewick-{size}.png"


def render_png(svg: Path, size: int) -> bytes:
    """The SVG drawn into a transparent size x size image, as PNG bytes."""
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice
    from PySide6.QtGui import QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise ValueError(f"{svg} is not a valid SVG")
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(0)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    data = QByteArray()
    buf = QBuffer(data)
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buf, "PNG")  # type: ignore[call-overload]  # stubs say bytes, runtime wants str
    buf.close()
    return bytes(data.data())


def ico_bytes(pngs: dict[int, bytes]) -> bytes:
    """An ICO file whose entries are PNG images (supported since Windows Vista)."""
    sizes = sorted(pngs)
    header = struct.pack("<HHH", 0, 1, len(sizes))
    offset = len(header) + 16 * len(sizes)
    entries, blobs = b"", b""
    for s in sizes:
        data = pngs[s]
        # Width/height 0 means 256 in an ICO directory entry.
        entries += struct.pack("<BBBBHHII", s % 256, s % 256, 0, 0, 1, 32, len(data), offset)
        blobs += data
        offset += len(data)
    return header + entries + blobs


def icns_bytes(pngs: dict[int, bytes]) -> bytes:
    body = b""
    for kind, size in ICNS_TYPES:
        data = pngs[size]
        body += kind + struct.pack(">I", len(data) + 8) + data
    return b"icns" + struct.pack(">I", len(body) + 8) + body


def render_all(svg: Path = SVG, out: Path = ICONS) -> list[Path]:
    pngs = {s: render_png(svg, s) for s in PNG_SIZES}
    written: list[Path] = []
    for s, data in pngs.items():
        p = out / png_name(s)
        p.write_bytes(data)
        written.append(p)
    for name, data in (
        ("candlewick.ico", ico_bytes({s: pngs[s] for s in ICO_SIZES})),
        ("candlewick.icns", icns_bytes(pngs)),
    ):
        p = out / name
        p.write_bytes(data)
        written.append(p)
    return written


def main() -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtGui import QGuiApplication

    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])
    for p in render_all():
        print(p.relative_to(ICONS.parent.parent))
    del app
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
