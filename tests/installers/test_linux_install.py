"""The Linux user install: into a temporary HOME, with a stub bundle (the script only copies it).

The real bundle is checked by `make dist-check` (docs/installers.md); these tests prove the
script puts the entry and icons where freedesktop menus look, and that uninstall removes
exactly that and keeps the user's data.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINUX = REPO / "installers" / "linux"
APP_ID = "io.candlewick.Candlewick"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux installer")


def stub_bundle(root: Path) -> Path:
    bundle = root / "bundle" / "candlewick"
    (bundle / "_internal").mkdir(parents=True)
    exe = bundle / "candlewick"
    exe.write_text('#!/bin/sh\necho stub-candlewick "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    (bundle / "_internal" / "payload.bin").write_bytes(b"x" * 1000)
    return bundle


def run(script: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "HOME": str(home),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "CANDLEWICK_SKIP_XCB_CHECK": "1",
    }
    return subprocess.run(
        ["sh", str(script), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def installed_files(home: Path) -> set[Path]:
    return {p for p in home.rglob("*") if p.is_file() or p.is_symlink()}


def test_install_then_uninstall_leaves_only_user_data(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    bundle = stub_bundle(tmp_path)
    # The user already has data: uninstall must keep it.
    chats = home / ".local" / "share" / "candlewick" / "chats.sqlite"
    chats.parent.mkdir(parents=True)
    chats.write_bytes(b"my chats")
    before = installed_files(home)

    r = run(LINUX / "install.sh", home, str(bundle))
    assert r.returncode == 0, r.stderr

    share = home / ".local" / "share"
    desktop = share / "applications" / f"{APP_ID}.desktop"
    lib = home / ".local" / "lib" / "candlewick"
    exe = lib / "app" / "candlewick"
    entry = desktop.read_text()
    assert f'Exec="{exe}"' in entry
    assert f"TryExec={exe}" in entry
    assert f"Icon={APP_ID}" in entry
    for size in (16, 32, 48, 64, 128, 256, 512):
        icon = share / "icons" / "hicolor" / f"{size}x{size}" / "apps" / f"{APP_ID}.png"
        assert (
            icon.read_bytes()
            == (REPO / "resources" / "icons" / f"candlewick-{size}.png").read_bytes()
        )
    assert (share / "icons" / "hicolor" / "scalable" / "apps" / f"{APP_ID}.svg").is_file()
    assert (lib / "app" / "_internal" / "payload.bin").read_bytes() == b"x" * 1000
    command = home / ".local" / "bin" / "candlewick"
    assert command.resolve() == exe.resolve()
    out = subprocess.run(
        [str(command), "--self-test"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    assert out.strip() == "stub-candlewick --self-test"
    assert str(lib / "uninstall.sh") in r.stdout

    # Installing again (an update) replaces the bundle in place.
    (bundle / "_internal" / "payload.bin").write_bytes(b"v2")
    assert run(LINUX / "install.sh", home, str(bundle)).returncode == 0
    assert (lib / "app" / "_internal" / "payload.bin").read_bytes() == b"v2"
    assert not (lib / "app.new").exists()

    r = run(lib / "uninstall.sh", home)
    assert r.returncode == 0, r.stderr
    assert "kept:" in r.stdout
    leftovers = {
        p
        for p in installed_files(home) - before
        if not p.name.startswith(("icon-theme.cache", "mimeinfo.cache"))
    }
    assert leftovers == set()
    assert not lib.exists()
    assert chats.read_bytes() == b"my chats"


def test_uninstall_purge_removes_user_data(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    assert run(LINUX / "install.sh", home, str(stub_bundle(tmp_path))).returncode == 0
    data = home / ".local" / "share" / "candlewick"
    config = home / ".config" / "candlewick"
    for d in (data, config):
        d.mkdir(parents=True)
        (d / "file").write_text("x")
    r = run(home / ".local" / "lib" / "candlewick" / "uninstall.sh", home, "--purge")
    assert r.returncode == 0, r.stderr
    assert not data.exists() and not config.exists()


def test_install_without_bundle_is_one_clear_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    r = run(LINUX / "install.sh", home, str(tmp_path / "nothing"))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"install.sh: error: no Candlewick bundle at {tmp_path / 'nothing'} "
        "(build one with 'make dist')"
    ]
    assert not (home / ".local").exists()


def test_uninstall_rejects_unknown_option(tmp_path: Path) -> None:
    r = run(LINUX / "uninstall.sh", tmp_path, "--everything")
    assert r.returncode == 2
    assert "unknown option --everything" in r.stderr


def test_install_warns_when_xcb_cursor_is_missing(tmp_path: Path) -> None:
    """Without libxcb-cursor the install still works but names the package to install."""
    home = tmp_path / "home"
    home.mkdir()
    fake_bin = tmp_path / "fakebin"
    fake_bin.mkdir()
    # An ldconfig that knows no libraries, and library dirs looked up under an empty root.
    (fake_bin / "ldconfig").write_text("#!/bin/sh\nexit 0\n")
    (fake_bin / "ldconfig").chmod(0o755)
    script = tmp_path / "install.sh"
    text = (LINUX / "install.sh").read_text()
    for d in (
        "/usr/lib64",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib",
        "/lib64",
        "/lib",
    ):
        text = text.replace(f" {d}", f" {tmp_path}/noroot{d}")
    script.write_text(text)
    shutil.copy(LINUX / "uninstall.sh", tmp_path / "uninstall.sh")
    (tmp_path / "resources").symlink_to(REPO / "resources")
    env = {"HOME": str(home), "PATH": f"{fake_bin}:/usr/bin:/bin"}
    r = subprocess.run(
        ["sh", str(script), str(stub_bundle(tmp_path))],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert "libxcb-cursor is missing" in r.stderr
    assert "libxcb-cursor0" in r.stderr or "xcb-util-cursor" in r.stderr


def test_tarball_holds_bundle_installer_and_resources(tmp_path: Path) -> None:
    bundle = stub_bundle(tmp_path)
    out = tmp_path / "out"
    r = subprocess.run(
        ["sh", str(LINUX / "make_tarball.sh"), str(bundle), str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    tarball = Path(r.stdout.strip().splitlines()[-1])
    with tarfile.open(tarball) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    top = next((tmp_path / "x").iterdir())
    assert top.name.startswith("candlewick-") and top.name.endswith(os.uname().machine)
    # Unpacked, its own install.sh finds the bundle and resources beside it.
    home = tmp_path / "home"
    home.mkdir()
    r = run(top / "install.sh", home)
    assert r.returncode == 0, r.stderr
    assert (home / ".local" / "share" / "applications" / f"{APP_ID}.desktop").is_file()
    assert (home / ".local" / "lib" / "candlewick" / "app" / "_internal" / "payload.bin").is_file()


def test_appdir_runs_the_bundle_through_apprun(tmp_path: Path) -> None:
    bundle = stub_bundle(tmp_path)
    out = tmp_path / "out"
    env = {"PATH": "/usr/bin:/bin"}  # no appimagetool: the AppDir is the result
    r = subprocess.run(
        ["sh", str(LINUX / "make_appimage.sh"), str(bundle), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    appdir = Path(r.stdout.strip().splitlines()[-1])
    assert (appdir / f"{APP_ID}.desktop").is_file()
    assert (appdir / ".DirIcon").resolve() == (appdir / f"{APP_ID}.png").resolve()
    ran = subprocess.run(
        [str(appdir / "AppRun"), "--self-test"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert ran.stdout.strip() == "stub-candlewick --self-test"
