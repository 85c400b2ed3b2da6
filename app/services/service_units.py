"""The background service's definition for each platform, as text: a systemd user unit
(Linux), a LaunchAgent property list (macOS) and a Task Scheduler task (Windows). Qt-free.

Each one runs the same command (`ServiceSpec.argv`: this install's `candlewick serve` with the
Local server's settings), starts at login, restarts it after a crash but not after a user error
(serve exits 2 on bad settings or a missing model: starting again would fail the same way), and
keeps what it prints: the journal and serve's own log file on Linux, the log file (and a file
for launchd's own output) on macOS, the log file on Windows. `app.services.service_control`
writes and registers them; this module only builds and reads the text.
"""

from __future__ import annotations

import os
import plistlib
import re
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

UNIT_NAME = "candlewick.service"
LAUNCHD_LABEL = "io.candlewick.server"
TASK_NAME = "Candlewick server"
DESCRIPTION = "Candlewick local model server (OpenAI/Ollama-compatible API)"
# serve's exit status for a user error (app.cli): the same settings would fail again.
USER_ERROR_STATUS = 2
RESTART_DELAY_S = 5
# Environment a service needs from the shell that installed it: where the profile lives
# (CANDLEWICK_HOME, or the XDG folders platformdirs reads) and where the models' caches are.
CARRIED_ENV = (
    "CANDLEWICK_HOME",
    "XDG_DATA_HOME",
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "XDG_STATE_HOME",
    "HF_HOME",
    "HF_HUB_CACHE",
)
# Lines reach the journal (and the log file) as they are printed, not when a buffer fills.
FIXED_ENV = (("PYTHONUNBUFFERED", "1"),)
TASK_NS = "http://schemas.microsoft.com/windows/2004/02/mit/task"


@dataclass(frozen=True)
class ServiceSpec:
    """What the service runs: `argv` (an absolute executable first), with `env` set, from
    `working_dir`; `log_file`: where serve keeps its log (shown by `candlewick service
    logs`)."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    working_dir: Path
    log_file: Path


def launcher(
    argv0: str | None = None, *, executable: str | None = None, frozen: bool | None = None
) -> tuple[str, ...]:
    """The command that starts this install's `candlewick`, absolute, so the service runs the
    same program whatever its PATH: the frozen bundle itself; the `candlewick` script this
    process was started as, or the one beside this Python (a virtual environment's); else
    this Python with `-m app.cli` (an editable install finds the project from any folder)."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    executable = sys.executable if executable is None else executable
    frozen = bool(getattr(sys, "frozen", False)) if frozen is None else frozen
    if frozen:
        return (os.path.abspath(executable),)
    started = Path(argv0)
    if started.name.lower().startswith("candlewick") and started.is_file():
        return (os.path.abspath(started),)
    folder = Path(executable).parent
    for name in ("candlewick", "candlewick.exe"):
        beside = folder / name
        if beside.is_file():
            return (os.path.abspath(beside),)
    return (os.path.abspath(executable), "-m", "app.cli")


def carried_env(environ: dict[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    """The variables of CARRIED_ENV set here, then FIXED_ENV."""
    environ = dict(os.environ) if environ is None else environ
    carried = tuple((k, environ[k]) for k in CARRIED_ENV if environ.get(k))
    return carried + FIXED_ENV


# -- systemd ---------------------------------------------------------------------------------

_PLAIN = re.compile(r"[A-Za-z0-9_@+=:,./-]+")


def _no_newline(text: str) -> str:
    if "\n" in text or "\r" in text:
        raise ValueError(f"a service command cannot hold a line break: {text!r}")
    return text


def systemd_quote(arg: str, *, expand_vars: bool = True) -> str:
    """One word of a unit's ExecStart= (or, `expand_vars` False, an Environment= value):
    plain words as they are, others in double quotes with `\\` and `"` escaped. `%` is a
    specifier in both and is doubled; `$` expands variables in ExecStart= only."""
    _no_newline(arg)
    if _PLAIN.fullmatch(arg):
        return arg
    inner = arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    if expand_vars:
        inner = inner.replace("$", "$$")
    return f'"{inner}"'


def systemd_unit(spec: ServiceSpec) -> str:
    """The user unit (~/.config/systemd/user/candlewick.service)."""
    exec_start = " ".join(systemd_quote(a) for a in spec.argv)
    env = "".join(
        f"Environment={systemd_quote(f'{k}={v}', expand_vars=False)}\n" for k, v in spec.env
    )
    return (
        "# Written by `candlewick service install`; `candlewick service uninstall` removes it.\n"
        "# Run `candlewick service install` again after changing the Local server's settings.\n"
        "[Unit]\n"
        f"Description={DESCRIPTION}\n"
        # After five failed starts in ten minutes systemd stops trying (status says so).
        "StartLimitIntervalSec=600\n"
        "StartLimitBurst=5\n"
        "\n"
        "[Service]\n"
        "Type=exec\n"
        f"ExecStart={exec_start}\n"
        f"{env}"
        f"WorkingDirectory={systemd_quote(str(spec.working_dir), expand_vars=False)}\n"
        "Restart=on-failure\n"
        f"RestartSec={RESTART_DELAY_S}\n"
        f"RestartPreventExitStatus={USER_ERROR_STATUS}\n"
        # serve ends its requests and frees the models on SIGTERM.
        "TimeoutStopSec=30\n"
        "StandardOutput=journal\n"
        "StandardError=journal\n"
        "SyslogIdentifier=candlewick\n"
        "\n"
        "[Install]\n"
        "WantedBy=default.target\n"
    )


def unit_exec_start(text: str) -> list[str]:
    """The command a unit written by `systemd_unit` runs, as its words. Our quoting is a
    subset of systemd's that POSIX shell words read the same way (double quotes, `\\` and `"`
    escaped), so `shlex` reads it; the doubled `%` and `$` are then undone."""
    for line in text.splitlines():
        if line.startswith("ExecStart="):
            words = shlex.split(line.removeprefix("ExecStart="), posix=True)
            return [w.replace("%%", "%").replace("$$", "$") for w in words]
    raise ValueError("the unit has no ExecStart= line")


def unit_environment(text: str) -> dict[str, str]:
    """The Environment= settings of a unit written by `systemd_unit`."""
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("Environment="):
            for word in shlex.split(line.removeprefix("Environment="), posix=True):
                key, _, value = word.replace("%%", "%").partition("=")
                env[key] = value
    return env


# -- launchd ---------------------------------------------------------------------------------


def launchd_plist(spec: ServiceSpec, launchd_log: Path) -> bytes:
    """The LaunchAgent (~/Library/LaunchAgents/io.candlewick.server.plist): started at
    login (RunAtLoad), started again only when it exits with a failure (KeepAlive
    SuccessfulExit false), launchd's own output (a crash before serve's log opens) in
    `launchd_log`."""
    for a in spec.argv:
        _no_newline(a)
    plist = {
        "Label": LAUNCHD_LABEL,
        "ProgramArguments": list(spec.argv),
        "EnvironmentVariables": dict(spec.env),
        "WorkingDirectory": str(spec.working_dir),
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},
        "ThrottleInterval": RESTART_DELAY_S * 2,
        "ProcessType": "Background",
        "StandardOutPath": str(launchd_log),
        "StandardErrorPath": str(launchd_log),
    }
    return plistlib.dumps(plist, fmt=plistlib.FMT_XML, sort_keys=False)


# -- Task Scheduler --------------------------------------------------------------------------


def task_xml(spec: ServiceSpec, user: str) -> str:
    """The scheduled task `schtasks /Create /XML` reads: at `user`'s logon, with no time
    limit, restarted three times a minute apart after a failure, never two at once. Task
    Scheduler starts it with the user's own environment: `spec.env` (CANDLEWICK_HOME and the
    like) must be set as user variables to reach it, and `service install` says so. Write
    it as UTF-16, the encoding schtasks expects."""
    for a in spec.argv:
        _no_newline(a)
    ET.register_namespace("", TASK_NS)

    def sub(parent: ET.Element, tag: str, text: str | None = None) -> ET.Element:
        el = ET.SubElement(parent, f"{{{TASK_NS}}}{tag}")
        if text is not None:
            el.text = text
        return el

    task = ET.Element(f"{{{TASK_NS}}}Task", {"version": "1.2"})
    info = sub(task, "RegistrationInfo")
    sub(info, "Description", DESCRIPTION)
    logon = sub(sub(task, "Triggers"), "LogonTrigger")
    sub(logon, "Enabled", "true")
    sub(logon, "UserId", user)
    principal = sub(sub(task, "Principals"), "Principal")
    principal.set("id", "Author")
    sub(principal, "UserId", user)
    sub(principal, "LogonType", "InteractiveToken")
    sub(principal, "RunLevel", "LeastPrivilege")
    settings = sub(task, "Settings")
    sub(settings, "MultipleInstancesPolicy", "IgnoreNew")
    sub(settings, "DisallowStartIfOnBatteries", "false")
    sub(settings, "StopIfGoingOnBatteries", "false")
    sub(settings, "AllowHardTerminate", "true")
    sub(settings, "StartWhenAvailable", "true")
    sub(settings, "ExecutionTimeLimit", "PT0S")  # a server runs until stopped
    restart = sub(settings, "RestartOnFailure")
    sub(restart, "Interval", "PT1M")
    sub(restart, "Count", "3")
    sub(settings, "Enabled", "true")
    sub(settings, "Hidden", "false")
    actions = sub(task, "Actions")
    actions.set("Context", "Author")
    action = sub(actions, "Exec")
    sub(action, "Command", spec.argv[0])
    # Windows parses a command line by the C runtime's rules, which list2cmdline writes.
    sub(action, "Arguments", subprocess.list2cmdline(spec.argv[1:]))
    sub(action, "WorkingDirectory", str(spec.working_dir))
    ET.indent(task)
    return '<?xml version="1.0" encoding="UTF-16"?>\n' + ET.tostring(task, encoding="unicode")


__all__ = [
    "FIXED_ENV",
    "LAUNCHD_LABEL",
    "TASK_NAME",
    "TASK_NS",
    "UNIT_NAME",
    "ServiceSpec",
    "carried_env",
    "launchd_plist",
    "launcher",
    "systemd_quote",
    "systemd_unit",
    "task_xml",
    "unit_environment",
    "unit_exec_start",
]
