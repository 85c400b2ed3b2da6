"""The service through the platform's manager: on Linux, the `systemctl --user` calls made
when a user manager runs (recorded by a stand-in for systemctl), and one line with the
command to run instead where none does (as on these machines)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from app.services.service_control import ServiceControl, ServiceError, option, probe_health
from app.services.service_units import UNIT_NAME, ServiceSpec

NO_BUS = "Failed to connect to bus: No medium found"


class Systemctl:
    """Answers `systemctl --user ...` as a running user manager would, or as a machine
    without one (`manager=False`), and records each call."""

    def __init__(self, *, manager: bool = True, show: str = "") -> None:
        self.manager = manager
        self.show = show
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        argv = list(argv)
        self.calls.append(argv)
        if not self.manager:
            return subprocess.CompletedProcess(argv, 1, "", NO_BUS + "\n")
        out = self.show if argv[2:3] == ["show"] else ""
        return subprocess.CompletedProcess(argv, 0, out, "")

    def actions(self) -> list[list[str]]:
        """The calls other than the manager probe."""
        return [c[2:] for c in self.calls if c[2:] != ["show-environment"]]


def control(tmp_path: Path, systemctl: Systemctl) -> ServiceControl:
    return ServiceControl(
        platform="linux", home=tmp_path, runner=systemctl, which=lambda name: f"/usr/bin/{name}"
    )


def spec(tmp_path: Path) -> ServiceSpec:
    argv = ("/opt/candlewick/candlewick", "serve", "--host", "127.0.0.1", "--port", "8123")
    return ServiceSpec(argv, (("PYTHONUNBUFFERED", "1"),), tmp_path, tmp_path / "service.log")


@pytest.fixture(autouse=True)
def no_xdg_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)


def test_install_writes_the_unit_then_reloads_and_enables_it(tmp_path: Path) -> None:
    systemctl = Systemctl()
    c = control(tmp_path, systemctl)
    said = c.install(spec(tmp_path), tmp_path / "launchd.log")
    unit = tmp_path / ".config" / "systemd" / "user" / UNIT_NAME
    assert c.definition_path == unit and unit.is_file()
    assert systemctl.actions() == [["daemon-reload"], ["enable", UNIT_NAME]]
    assert "enabled: it starts at login" in said
    assert c.installed_argv() == list(spec(tmp_path).argv)


def test_start_stop_and_state_ask_the_user_manager(tmp_path: Path) -> None:
    systemctl = Systemctl(
        show="LoadState=loaded\nActiveState=active\nSubState=running\n"
        "UnitFileState=enabled\nMainPID=4242\nResult=success\n"
    )
    c = control(tmp_path, systemctl)
    c.install(spec(tmp_path), tmp_path / "launchd.log")
    systemctl.calls.clear()
    assert c.start() == "started"
    assert c.stop() == "stopped"
    state = c.state()
    assert systemctl.actions()[:2] == [["start", UNIT_NAME], ["stop", UNIT_NAME]]
    assert systemctl.actions()[2][:2] == ["show", UNIT_NAME]
    assert state.state == "active (running), enabled, pid 4242"
    assert state.problem is None and state.installed


def test_a_failed_unit_says_why(tmp_path: Path) -> None:
    systemctl = Systemctl(
        show="ActiveState=failed\nSubState=failed\nUnitFileState=enabled\nMainPID=0\n"
        "Result=exit-code\n"
    )
    c = control(tmp_path, systemctl)
    c.install(spec(tmp_path), tmp_path / "launchd.log")
    assert c.state().state == "failed (failed), enabled, last result: exit-code"


def test_without_a_user_manager_the_unit_is_written_and_each_action_says_what_to_do(
    tmp_path: Path,
) -> None:
    systemctl = Systemctl(manager=False)
    c = control(tmp_path, systemctl)
    said = c.install(spec(tmp_path), tmp_path / "launchd.log")
    assert c.definition_path.is_file()
    assert said.startswith(f"wrote {c.definition_path}; not registered: no systemd user manager")
    command = "/opt/candlewick/candlewick serve --host 127.0.0.1 --port 8123"
    assert said.endswith(command)
    for action in (c.start, c.stop):
        with pytest.raises(ServiceError) as e:
            action()
        message = str(e.value)
        assert "\n" not in message
        assert NO_BUS in message and message.endswith(command)
    state = c.state()
    assert (state.state, state.installed) == ("installed, not managed", True)
    assert state.problem is not None and NO_BUS in state.problem
    # Only the probe was ever called: nothing else was asked of a manager that is not there.
    assert systemctl.actions() == []
    assert c.uninstall() == f"removed {c.definition_path} (no manager was told: {state.problem})"
    assert not c.definition_path.exists()


def test_uninstall_disables_stops_and_forgets_the_unit(tmp_path: Path) -> None:
    systemctl = Systemctl()
    c = control(tmp_path, systemctl)
    c.install(spec(tmp_path), tmp_path / "launchd.log")
    systemctl.calls.clear()
    assert c.uninstall() == f"removed {c.definition_path}"
    assert systemctl.actions() == [["disable", "--now", UNIT_NAME], ["daemon-reload"]]
    assert c.uninstall().startswith("not installed")
    with pytest.raises(ServiceError, match="not installed: run `candlewick service install`"):
        c.start()


def test_a_missing_systemctl_is_said_too(tmp_path: Path) -> None:
    c = ServiceControl(platform="linux", home=tmp_path, runner=Systemctl(), which=lambda _: None)
    assert c.no_manager() == "systemctl is not installed"


def test_xdg_config_home_holds_the_unit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    c = control(tmp_path, Systemctl())
    assert c.definition_path == tmp_path / "cfg" / "systemd" / "user" / UNIT_NAME


def test_options_are_read_from_a_command_line() -> None:
    argv = ["x", "serve", "--port", "8123", "--host=0.0.0.0"]
    assert option(argv, "--port", "8080") == "8123"
    assert option(argv, "--host", "127.0.0.1") == "0.0.0.0"
    assert option(argv, "--model", "default") == "default"


def test_probe_says_in_one_line_when_nothing_answers() -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on (bound, never listening)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        said = probe_health(f"http://127.0.0.1:{port}", timeout_s=5)
    assert isinstance(said, str) and said.startswith(f"nothing answers at http://127.0.0.1:{port}")


class Recorder:
    """A manager that accepts every call (launchctl, schtasks), recording them."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        return subprocess.CompletedProcess(list(argv), 0, "", "")


def test_macos_loads_the_agent_with_launchctl(tmp_path: Path) -> None:
    calls = Recorder()
    c = ServiceControl(platform="darwin", home=tmp_path, runner=calls, which=lambda n: n)
    said = c.install(spec(tmp_path), tmp_path / "launchd.log")
    plist = tmp_path / "Library" / "LaunchAgents" / "io.candlewick.server.plist"
    assert c.definition_path == plist and plist.is_file()
    domain = f"gui/{os.getuid()}"
    assert calls.calls == [
        ["launchctl", "bootout", f"{domain}/io.candlewick.server"],  # a former one
        ["launchctl", "bootstrap", domain, str(plist)],
    ]
    assert said == f"wrote {plist}; loaded: it runs now and at login"
    calls.calls.clear()
    c.stop()  # unloaded, or launchd would start it again (KeepAlive)
    assert calls.calls == [["launchctl", "bootout", f"{domain}/io.candlewick.server"]]


def test_windows_registers_the_task_and_says_which_variables_it_cannot_carry(
    tmp_path: Path,
) -> None:
    calls = Recorder()
    c = ServiceControl(platform="win32", home=tmp_path, runner=calls, which=lambda n: n)
    s = ServiceSpec(
        spec(tmp_path).argv,
        (("CANDLEWICK_HOME", "D:\\profile"), ("PYTHONUNBUFFERED", "1")),
        tmp_path,
        tmp_path / "service.log",
    )
    said = c.install(s, tmp_path / "unused.log")
    path = c.definition_path
    assert calls.calls == [
        ["schtasks", "/Create", "/TN", "Candlewick server", "/XML", str(path), "/F"]
    ]
    assert path.read_bytes()[:2] in (b"\xff\xfe", b"\xfe\xff")  # UTF-16, as schtasks reads it
    assert said.endswith("set CANDLEWICK_HOME as user variables (setx) for it to see them")
    assert c.installed_argv() == list(s.argv)
