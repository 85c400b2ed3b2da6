"""`candlewick service`: install writes a unit `systemd-analyze verify` accepts; the command
that unit runs, run exactly as written, serves the Local server's settings; status and logs
say what runs. These machines have no systemd user manager, and a developer's machine has
one that a test must not touch: the CLI's manager here is a stand-in for a machine without
one (the calls made where one runs are tests/app/services/test_service_control.py's)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import keyring
import pytest
from PySide6.QtCore import QSettings

from app.cli import main, service_cmd
from app.services.local_server import KEY_ACCOUNT
from app.services.paths import AppPaths
from app.services.secrets import SERVICE
from app.services.service_control import ServiceControl
from app.services.service_units import unit_environment, unit_exec_start
from tests.app.services.test_service_control import NO_BUS, Systemctl
from tests.app.services.test_service_units import verify
from tests.engine.clients.bench_servers import free_port
from tests.memory_keyring import MemoryKeyring


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private HOME, a keyring in memory, and a machine without a systemd user manager."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    memory = MemoryKeyring()
    monkeypatch.setattr(keyring, "get_keyring", lambda: memory)
    monkeypatch.setattr(
        service_cmd,
        "_control",
        lambda platform=None: ServiceControl(
            platform=platform, home=home, runner=Systemctl(manager=False)
        ),
    )
    return home


def window_settings(values: dict[str, object]) -> None:
    """The Local server page's settings, written by QSettings as the window writes them."""
    paths = AppPaths.default().ensure()
    st = QSettings(str(paths.config / "window.ini"), QSettings.Format.IniFormat)
    for key, value in values.items():
        st.setValue(key, value)
    st.sync()


def unit_file(home: Path) -> Path:
    return home / ".config" / "systemd" / "user" / "candlewick.service"


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["service", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_install_writes_a_unit_systemd_accepts_with_the_window_s_settings(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    window_settings({"server/port": 8123, "server/parallel": 3, "server/ctx": 2048})
    code, out, err = cli(capsys, "install")
    assert (code, err) == (0, "")
    unit = unit_file(home)
    assert out.splitlines()[0].startswith(f"wrote {unit}; not registered: no systemd user")
    assert "serves 'default' on 127.0.0.1:8123 (3 slots of 2048 tokens, an API key required)" in out
    assert verify(unit, tmp_path) == ""
    argv = unit_exec_start(unit.read_text(encoding="utf-8"))
    assert Path(argv[0]).is_absolute() and os.access(argv[0], os.X_OK)
    paths = AppPaths.default()
    key_file = paths.config / "service-api-key"
    assert argv[argv.index("serve") :] == [
        "serve",
        *("--model", "default", "--host", "127.0.0.1", "--port", "8123"),
        *("--parallel", "3", "--ctx", "2048", "--api-key-file", str(key_file)),
        *("--log-file", str(paths.logs / "service.log")),
    ]
    # The key: a new one, in the keyring for the window too, and in a file for the service.
    key = keyring.get_keyring().get_password(SERVICE, KEY_ACCOUNT)
    assert key and key_file.read_text(encoding="utf-8") == key + "\n"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert key not in unit.read_text(encoding="utf-8")
    env = unit_environment(unit.read_text(encoding="utf-8"))
    assert env["CANDLEWICK_HOME"] == os.environ["CANDLEWICK_HOME"]


def test_install_refuses_what_serve_would_refuse_at_every_start(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    window_settings({"library/selected": "no-such-model"})
    code, _, err = cli(capsys, "install")
    assert code == 2 and err.count("\n") == 1
    assert "no model called 'no-such-model' in the library" in err
    window_settings({"library/selected": "default", "server/host": "0.0.0.0"})
    window_settings({"server/require_key": "false"})
    code, _, err = cli(capsys, "install")
    assert code == 2 and "refusing to listen on 0.0.0.0 without an API key" in err
    assert not unit_file(home).exists()


def test_print_shows_each_platform_s_definition_and_writes_nothing(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    window_settings({"server/require_key": "false"})
    assert main(["service", "install", "--print"]) == 0
    out = capsys.readouterr().out
    assert "[Service]" in out and "Restart=on-failure" in out
    assert main(["service", "install", "--print", "--platform", "macos"]) == 0
    assert "<key>ProgramArguments</key>" in capsys.readouterr().out
    assert not unit_file(home).exists()
    assert keyring.get_keyring().get_password(SERVICE, KEY_ACCOUNT) is None


def test_status_without_a_manager_says_so_in_one_line_with_the_command(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    window_settings({"server/port": port, "server/require_key": "false"})
    code, out, _ = cli(capsys, "status")
    assert code == service_cmd.NOT_RUNNING
    assert out.splitlines()[0].startswith("service: not installed")
    assert f"server: nothing answers at http://127.0.0.1:{port}" in out
    assert cli(capsys, "install")[0] == 0
    window_settings({"server/port": port + 1})  # changed in the window since
    code, out, _ = cli(capsys, "status")
    lines = out.splitlines()
    assert lines[0] == f"service: installed, not managed ({unit_file(home)})"
    assert lines[1].startswith("manager: no systemd user manager runs for this user")
    assert NO_BUS in lines[1] and "run its command in a terminal" in lines[1]
    assert lines[2].startswith("command: /") and f"--port {port}" in lines[2]
    assert lines[3] == (
        f"note: the Local server's settings changed since install (port {port + 1} now): "
        "run `candlewick service install` again to apply them"
    )
    code, _, err = cli(capsys, "start")
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("candlewick: error: cannot start the service: no systemd user manager")


def test_logs_print_the_tail_of_the_log_file(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(capsys, "logs")
    assert code == 2 and "no service log yet" in err
    log = AppPaths.default().ensure().logs / "service.log"
    log.write_text("".join(f"2026-01-01 00:00:0{i} line {i}\n" for i in range(8)))
    code, out, _ = cli(capsys, "logs", "-n", "3")
    assert code == 0
    assert out.splitlines() == [f"2026-01-01 00:00:0{i} line {i}" for i in (5, 6, 7)]


def test_uninstall_removes_the_unit_and_the_key_file(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(capsys, "install")[0] == 0
    key_file = AppPaths.default().config / "service-api-key"
    assert key_file.exists()
    code, out, _ = cli(capsys, "uninstall")
    assert code == 0
    assert out.startswith(f"removed {unit_file(home)} (no manager was told: no systemd user")
    assert not unit_file(home).exists() and not key_file.exists()
    # The window keeps its key.
    assert keyring.get_keyring().get_password(SERVICE, KEY_ACCOUNT)
