"""The Local server's settings read without Qt from the file the window's QSettings writes, and
the key file the service reads."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings

from app.services.paths import AppPaths
from app.services.server_profile import (
    ServerProfile,
    key_path,
    read_profile,
    write_key_file,
)


def window_settings(paths: AppPaths, values: dict[str, object]) -> None:
    """Written by QSettings itself, as the window writes them."""
    paths.config.mkdir(parents=True, exist_ok=True)
    st = QSettings(str(paths.config / "window.ini"), QSettings.Format.IniFormat)
    for key, value in values.items():
        st.setValue(key, value)
    st.setValue("window/geometry", b"\x01\x02binary")  # what else the file holds
    st.sync()
    assert st.status() == QSettings.Status.NoError


def test_the_window_s_settings_are_read_as_it_saved_them() -> None:
    paths = AppPaths.default()
    window_settings(
        paths,
        {
            "server/host": "0.0.0.0",
            "server/port": 8123,
            "server/parallel": 2,
            "server/ctx": 1024,
            "server/require_key": "false",
            "library/selected": "smollm2-135m-instruct-q4_1",
        },
    )
    assert read_profile(paths) == ServerProfile(
        host="0.0.0.0",
        port=8123,
        parallel=2,
        ctx_per_slot=1024,
        require_key=False,
        model="smollm2-135m-instruct-q4_1",
    )


def test_nothing_saved_gives_the_page_s_defaults() -> None:
    assert read_profile(AppPaths.default()) == ServerProfile()


def test_a_hand_edited_number_keeps_the_default_as_the_page_does() -> None:
    paths = AppPaths.default()
    paths.config.mkdir(parents=True, exist_ok=True)
    (paths.config / "window.ini").write_text(
        "[server]\nport=eighty\nparallel=3\nctx=\n\n[library]\nselected=\n", encoding="utf-8"
    )
    profile = read_profile(paths)
    assert (profile.port, profile.parallel, profile.ctx_per_slot) == (8080, 3, 4096)
    assert profile.model == "default"


def test_serve_args_name_the_key_file_only_when_a_key_is_required(tmp_path: Path) -> None:
    key = tmp_path / "key"
    args = ServerProfile(port=9000, model="m").serve_args(key)
    assert args[-2:] == ["--api-key-file", str(key)]
    assert "--api-key-file" not in ServerProfile(require_key=False).serve_args(None)
    with pytest.raises(ValueError, match="key file"):
        ServerProfile().serve_args(None)


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_the_key_file_is_readable_by_its_owner_only() -> None:
    paths = AppPaths.default()
    old = os.umask(0)  # even with a umask that would let everyone read a plain file
    try:
        path = write_key_file(paths, "cw-secret-key-1")
    finally:
        os.umask(old)
    assert path == key_path(paths)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text(encoding="utf-8") == "cw-secret-key-1\n"
    write_key_file(paths, "cw-secret-key-2")  # replaced whole
    assert path.read_text(encoding="utf-8") == "cw-secret-key-2\n"
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".part")] == []
