"""The service definitions as text: the systemd unit (read back word for word, and accepted by
`systemd-analyze verify`), the LaunchAgent property list and the Task Scheduler XML."""

from __future__ import annotations

import os
import plistlib
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from app.services.service_control import ServiceControl
from app.services.service_units import (
    LAUNCHD_LABEL,
    TASK_NS,
    ServiceSpec,
    carried_env,
    launchd_plist,
    launcher,
    systemd_quote,
    systemd_unit,
    task_xml,
    unit_environment,
    unit_exec_start,
)

# Words a path or a setting may hold that systemd would otherwise read its own way.
AWKWARD = [
    "/opt/My Apps/candlewick",
    'say "hi"',
    "50%",
    "$HOME",
    "back\\slash",
    "it's",
    "",
    "plain-word_1.2:3",
]


def spec(tmp_path: Path, argv: tuple[str, ...] | None = None) -> ServiceSpec:
    exe = tmp_path / "bin" / "candlewick"
    return ServiceSpec(
        argv or (str(exe), "serve", "--port", "8123"),
        (("CANDLEWICK_HOME", str(tmp_path / "profile with space")), ("PYTHONUNBUFFERED", "1")),
        tmp_path,
        tmp_path / "logs" / "service.log",
    )


def test_exec_start_reads_back_every_word_as_written(tmp_path: Path) -> None:
    argv = (str(tmp_path / "bin" / "candlewick"), "serve", *AWKWARD)
    unit = systemd_unit(spec(tmp_path, argv))
    assert unit_exec_start(unit) == list(argv)
    assert unit_environment(unit) == {
        "CANDLEWICK_HOME": str(tmp_path / "profile with space"),
        "PYTHONUNBUFFERED": "1",
    }


def test_quoting_doubles_what_systemd_would_expand() -> None:
    assert systemd_quote("50%") == '"50%%"'
    assert systemd_quote("$HOME") == '"$$HOME"'
    assert systemd_quote("$HOME", expand_vars=False) == '"$HOME"'  # Environment= keeps $
    assert systemd_quote("/usr/bin/candlewick") == "/usr/bin/candlewick"
    with pytest.raises(ValueError, match="line break"):
        systemd_quote("two\nlines")


def test_the_unit_restarts_on_failure_but_not_after_a_user_error(tmp_path: Path) -> None:
    unit = systemd_unit(spec(tmp_path))
    lines = unit.splitlines()
    for expected in (
        "Restart=on-failure",
        "RestartPreventExitStatus=2",
        "StandardOutput=journal",
        "StandardError=journal",
        "WantedBy=default.target",
        "Type=exec",
    ):
        assert expected in lines
    assert lines.index("[Unit]") < lines.index("[Service]") < lines.index("[Install]")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
def test_systemd_analyze_accepts_the_unit_and_refuses_a_broken_one(tmp_path: Path) -> None:
    exe = tmp_path / "bin" / "candlewick"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    unit = tmp_path / "candlewick.service"
    unit.write_text(systemd_unit(spec(tmp_path, (str(exe), "serve", *AWKWARD))))
    assert verify(unit, tmp_path) == ""
    # The check can fail: a unit whose program is missing is refused.
    unit.write_text(systemd_unit(spec(tmp_path, (str(tmp_path / "missing"), "serve"))))
    assert "missing" in verify(unit, tmp_path)


def verify(unit: Path, tmp_path: Path) -> str:
    """`systemd-analyze --user verify`: '' when it has nothing to say (warnings count)."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {**os.environ, "HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(runtime)}
    done = subprocess.run(
        ["systemd-analyze", "--user", "verify", str(unit)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    said = (done.stdout + done.stderr).strip()
    return said or ("" if done.returncode == 0 else f"exit status {done.returncode}")


def test_the_launch_agent_runs_the_same_command_at_login(tmp_path: Path) -> None:
    s = spec(tmp_path, (str(tmp_path / "Candlewick.app" / "candlewick"), "serve", *AWKWARD))
    plist = plistlib.loads(launchd_plist(s, tmp_path / "launchd.log"))
    assert plist["Label"] == LAUNCHD_LABEL
    assert plist["ProgramArguments"] == list(s.argv)
    assert plist["EnvironmentVariables"] == dict(s.env)
    assert plist["RunAtLoad"] is True
    assert plist["KeepAlive"] == {"SuccessfulExit": False}  # restarted only after a failure
    assert plist["StandardErrorPath"] == str(tmp_path / "launchd.log")
    # What `status` reads back from the installed file.
    control = ServiceControl(platform="darwin", home=tmp_path, which=lambda _: None)
    control.definition_path.parent.mkdir(parents=True)
    control.definition_path.write_bytes(launchd_plist(s, tmp_path / "launchd.log"))
    assert control.installed_argv() == list(s.argv)


def test_the_scheduled_task_starts_at_logon_with_the_same_command(tmp_path: Path) -> None:
    exe = "C:\\Program Files\\Candlewick\\candlewick.exe"
    key = "C:\\Users\\ada\\AppData\\Local\\candlewick\\service-api-key"
    s = spec(tmp_path, (exe, "serve", "--api-key-file", key, "--model", "my model"))
    text = task_xml(s, "ada")
    root = ET.fromstring(text.encode("utf-16"))
    ns = {"t": TASK_NS}
    assert root.findtext("t:Triggers/t:LogonTrigger/t:UserId", None, ns) == "ada"
    assert root.findtext("t:Actions/t:Exec/t:Command", None, ns) == exe
    args = root.findtext("t:Actions/t:Exec/t:Arguments", None, ns)
    assert args == f'serve --api-key-file {key} --model "my model"'
    assert root.findtext("t:Settings/t:ExecutionTimeLimit", None, ns) == "PT0S"
    assert root.findtext("t:Settings/t:RestartOnFailure/t:Count", None, ns) == "3"
    control = ServiceControl(platform="win32", home=tmp_path, which=lambda _: None)
    control.definition_path.parent.mkdir(parents=True)
    control.definition_path.write_bytes(control.definition_text(s, tmp_path / "unused.log"))
    assert control.installed_argv() == list(s.argv)


def test_a_line_break_in_a_command_is_refused_everywhere(tmp_path: Path) -> None:
    s = spec(tmp_path, ("/bin/candlewick", "serve", "--model", "a\nb"))
    for write in (systemd_unit, lambda s: launchd_plist(s, tmp_path), lambda s: task_xml(s, "u")):
        with pytest.raises(ValueError, match="line break"):
            write(s)


def test_the_launcher_is_this_install_by_an_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = tmp_path / "Candlewick" / "candlewick"
    assert launcher("whatever", executable=str(bundle), frozen=True) == (str(bundle),)
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    script = venv / "candlewick"
    script.write_text("#!/bin/sh\n")
    python = venv / "python"
    # Started as the console script (any working folder): that script.
    monkeypatch.chdir(venv)
    assert launcher("candlewick", executable=str(python), frozen=False) == (str(script),)
    # Started otherwise (pytest, python -m app.cli): the script beside this Python.
    assert launcher("pytest", executable=str(python), frozen=False) == (str(script),)
    script.unlink()
    assert launcher("pytest", executable=str(python), frozen=False) == (
        str(python),
        "-m",
        "app.cli",
    )


def test_only_the_profile_s_locations_are_carried() -> None:
    env = carried_env({"CANDLEWICK_HOME": "/p", "PATH": "/bin", "AWS_SECRET": "x", "HF_HOME": ""})
    assert env == (("CANDLEWICK_HOME", "/p"), ("PYTHONUNBUFFERED", "1"))


def test_the_running_interpreter_s_launcher_exists() -> None:
    exe, *rest = launcher()
    assert Path(exe).is_absolute() and Path(exe).exists()
    assert rest in ([], ["-m", "app.cli"])
