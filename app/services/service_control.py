"""The background service, installed and run through the platform's own manager: systemd's
user manager (`systemctl --user`) on Linux, launchd (`launchctl`) on macOS, Task Scheduler
(`schtasks`) on Windows. Qt-free.

`ServiceControl` writes the definition (app.services.service_units) where the manager looks
for it, registers it to start at login, starts and stops it and says what state it is in.
Where there is no manager to call (a container, a server without a user session: no systemd
user manager), it writes the file all the same and every action that needs the manager says
so in one line, with the command to run instead. Only Linux is exercised by the tests; the
macOS and Windows paths build the same command with their managers' documented commands.
"""

from __future__ import annotations

import getpass
import json
import os
import plistlib
import shlex
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.services.atomic_write import write_bytes_atomic
from app.services.service_units import (
    FIXED_ENV,
    LAUNCHD_LABEL,
    TASK_NAME,
    TASK_NS,
    UNIT_NAME,
    ServiceSpec,
    launchd_plist,
    systemd_unit,
    task_xml,
    unit_exec_start,
)

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]
PROBE_TIMEOUT_S = 3.0


class ServiceError(Exception):
    """A service action that failed; `str()` is one line for the user."""


def run_command(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


@dataclass(frozen=True)
class ServiceState:
    """What the manager says about the service, for `candlewick service status`."""

    installed: bool
    definition: Path  # where the unit, property list or task file is
    state: str  # the manager's word for it ("active (running)", "failed", "not installed"...)
    argv: list[str] | None  # the command it runs, read back from the definition
    problem: str | None  # why the manager cannot be asked (None: it was)


class ServiceControl:
    def __init__(
        self,
        *,
        platform: str | None = None,
        home: Path | None = None,
        runner: Runner = run_command,
        which: Callable[[str], str | None] = shutil.which,
    ) -> None:
        self.platform = sys.platform if platform is None else platform
        self.home = Path.home() if home is None else home
        self._run = runner
        self._which = which

    # -- where ---------------------------------------------------------------------------

    @property
    def kind(self) -> str:
        if self.platform == "darwin":
            return "launchd"
        if self.platform.startswith("win"):
            return "schtasks"
        return "systemd"

    @property
    def definition_path(self) -> Path:
        if self.kind == "launchd":
            return self.home / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"
        if self.kind == "schtasks":  # schtasks reads it once; kept for status and re-installs
            return self.home / "AppData" / "Local" / "candlewick" / "candlewick-task.xml"
        config = os.environ.get("XDG_CONFIG_HOME") or str(self.home / ".config")
        return Path(config) / "systemd" / "user" / UNIT_NAME

    def definition_text(self, spec: ServiceSpec, launchd_log: Path) -> bytes:
        """The file `install` writes, byte for byte."""
        if self.kind == "launchd":
            return launchd_plist(spec, launchd_log)
        if self.kind == "schtasks":
            return task_xml(spec, getpass.getuser()).encode("utf-16")
        return systemd_unit(spec).encode("utf-8")

    # -- the manager ---------------------------------------------------------------------

    def _call(self, *argv: str) -> subprocess.CompletedProcess[str]:
        try:
            return self._run(argv)
        except (OSError, subprocess.SubprocessError) as e:
            raise ServiceError(f"{argv[0]} could not run: {e}") from None

    def no_manager(self) -> str | None:
        """Why the service manager cannot be asked here, in words (None: it can)."""
        tool = {"systemd": "systemctl", "launchd": "launchctl", "schtasks": "schtasks"}[self.kind]
        if self._which(tool) is None:
            return f"{tool} is not installed"
        if self.kind != "systemd":
            return None
        done = self._call("systemctl", "--user", "show-environment")
        if done.returncode != 0:
            why = _first_line(done.stderr) or f"exit status {done.returncode}"
            return f"no systemd user manager runs for this user (systemctl --user: {why})"
        return None

    def _require_manager(self, action: str) -> None:
        problem = self.no_manager()
        if problem is not None:
            raise ServiceError(f"cannot {action} the service: {problem}; {self.instead()}")

    def instead(self) -> str:
        """What to do where there is no manager: run the command yourself."""
        argv = self.installed_argv()
        if argv is None:
            return "run `candlewick serve` in a terminal or under your own supervisor"
        return f"run its command in a terminal or under your own supervisor: {shlex.join(argv)}"

    def _check(self, done: subprocess.CompletedProcess[str], what: str) -> None:
        if done.returncode != 0:
            why = _first_line(done.stderr) or _first_line(done.stdout)
            raise ServiceError(f"{what} failed: {why or f'exit status {done.returncode}'}")

    @property
    def _domain(self) -> str:
        return f"gui/{os.getuid()}" if hasattr(os, "getuid") else "gui"

    # -- actions -------------------------------------------------------------------------

    def install(self, spec: ServiceSpec, launchd_log: Path) -> str:
        """Write the definition (whole or not at all) and register it to start at login. The
        file is written even where no manager runs; the returned line says what happened."""
        path = self.definition_path
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, self.definition_text(spec, launchd_log))
        problem = self.no_manager()
        if problem is not None:
            return f"wrote {path}; not registered: {problem}; {self.instead()}"
        if self.kind == "systemd":
            self._check(self._call("systemctl", "--user", "daemon-reload"), "daemon-reload")
            self._check(self._call("systemctl", "--user", "enable", UNIT_NAME), "enable")
            return f"wrote {path}; enabled: it starts at login (`candlewick service start` now)"
        if self.kind == "launchd":
            self._call("launchctl", "bootout", f"{self._domain}/{LAUNCHD_LABEL}")  # a former one
            self._check(self._call("launchctl", "bootstrap", self._domain, str(path)), "bootstrap")
            return f"wrote {path}; loaded: it runs now and at login"
        self._check(
            self._call("schtasks", "/Create", "/TN", TASK_NAME, "/XML", str(path), "/F"),
            "schtasks /Create",
        )
        said = f"wrote {path}; registered as the task '{TASK_NAME}': it starts at logon"
        # A task has no variables of its own: those of this shell reach it only as user ones.
        carried = [k for k, _ in spec.env if k not in dict(FIXED_ENV)]
        if carried:
            said += f"; set {', '.join(carried)} as user variables (setx) for it to see them"
        return said

    def uninstall(self) -> str:
        """Stop it, unregister it and remove the definition."""
        path = self.definition_path
        problem = self.no_manager()
        if problem is None:
            if self.kind == "systemd":
                self._call("systemctl", "--user", "disable", "--now", UNIT_NAME)
            elif self.kind == "launchd":
                self._call("launchctl", "bootout", f"{self._domain}/{LAUNCHD_LABEL}")
            else:
                self._call("schtasks", "/End", "/TN", TASK_NAME)
                self._call("schtasks", "/Delete", "/TN", TASK_NAME, "/F")
        existed = path.exists()
        path.unlink(missing_ok=True)
        if problem is None and self.kind == "systemd":
            self._call("systemctl", "--user", "daemon-reload")
        if not existed:
            return f"not installed ({path} does not exist)"
        return f"removed {path}" + (f" (no manager was told: {problem})" if problem else "")

    def start(self) -> str:
        self._installed_or_fail()
        self._require_manager("start")
        if self.kind == "systemd":
            self._check(self._call("systemctl", "--user", "start", UNIT_NAME), "start")
        elif self.kind == "launchd":
            target = f"{self._domain}/{LAUNCHD_LABEL}"
            if self._call("launchctl", "print", target).returncode != 0:  # stopped: unloaded
                path = str(self.definition_path)
                self._check(self._call("launchctl", "bootstrap", self._domain, path), "bootstrap")
            self._check(self._call("launchctl", "kickstart", target), "kickstart")
        else:
            self._check(self._call("schtasks", "/Run", "/TN", TASK_NAME), "schtasks /Run")
        return "started"

    def stop(self) -> str:
        self._installed_or_fail()
        self._require_manager("stop")
        if self.kind == "systemd":
            self._check(self._call("systemctl", "--user", "stop", UNIT_NAME), "stop")
        elif self.kind == "launchd":
            # Unloaded: launchd would start a server that a signal ended again (KeepAlive).
            target = f"{self._domain}/{LAUNCHD_LABEL}"
            self._check(self._call("launchctl", "bootout", target), "bootout")
        else:
            self._check(self._call("schtasks", "/End", "/TN", TASK_NAME), "schtasks /End")
        return "stopped"

    def _installed_or_fail(self) -> None:
        if not self.definition_path.exists():
            raise ServiceError("the service is not installed: run `candlewick service install`")

    # -- state ---------------------------------------------------------------------------

    def installed_argv(self) -> list[str] | None:
        """The command the installed definition runs (None: none is installed, or it cannot
        be read)."""
        path = self.definition_path
        try:
            if self.kind == "launchd":
                with path.open("rb") as f:
                    return [str(a) for a in plistlib.load(f)["ProgramArguments"]]
            if self.kind == "schtasks":
                root = ET.fromstring(path.read_bytes().decode("utf-16"))
                ns = {"t": TASK_NS}
                command = root.findtext("t:Actions/t:Exec/t:Command", "", ns)
                arguments = root.findtext("t:Actions/t:Exec/t:Arguments", "", ns)
                # list2cmdline's words: split on blanks, double quotes group; a backslash is
                # a path's (the C runtime escapes only quotes, which our arguments lack).
                words = shlex.shlex(arguments, posix=True)
                words.whitespace_split, words.escape = True, ""
                return [command, *words]
            return unit_exec_start(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, KeyError, ET.ParseError, plistlib.InvalidFileException):
            return None

    def state(self) -> ServiceState:
        path = self.definition_path
        installed = path.exists()
        argv = self.installed_argv() if installed else None
        problem = self.no_manager()
        if problem is not None:
            word = "installed, not managed" if installed else "not installed"
            return ServiceState(installed, path, word, argv, problem)
        if self.kind == "systemd":
            done = self._call(
                "systemctl",
                "--user",
                "show",
                UNIT_NAME,
                "--property=LoadState,ActiveState,SubState,UnitFileState,MainPID,Result",
            )
            props = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
            word = f"{props.get('ActiveState', '?')} ({props.get('SubState', '?')})"
            if props.get("UnitFileState"):
                word += f", {props['UnitFileState']}"
            if props.get("MainPID", "0") != "0":
                word += f", pid {props['MainPID']}"
            if props.get("Result", "success") != "success":
                word += f", last result: {props['Result']}"
        elif self.kind == "launchd":
            done = self._call("launchctl", "print", f"{self._domain}/{LAUNCHD_LABEL}")
            found = [
                ln.strip() for ln in done.stdout.splitlines() if ln.strip().startswith("state")
            ]
            word = found[0].partition("=")[2].strip() if found else "not loaded"
        else:
            done = self._call("schtasks", "/Query", "/TN", TASK_NAME, "/FO", "LIST")
            found = [ln for ln in done.stdout.splitlines() if ln.startswith("Status:")]
            word = found[0].partition(":")[2].strip() if found else "not registered"
        return ServiceState(installed, path, word if installed else "not installed", argv, None)


def option(argv: Sequence[str], name: str, default: str) -> str:
    """The value of `--name VALUE` (or `--name=VALUE`) in a command line."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.partition("=")[2]
    return default


def probe_health(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, Any] | str:
    """The server's /health answer at `url` (a loading server answers 503 with a body too), or
    one line saying why there was none."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout_s) as r:
            body = r.read()
    except urllib.error.HTTPError as e:
        body = e.read()
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        return f"nothing answers at {url} ({reason})"
    try:
        answer = json.loads(body)
    except ValueError:
        return f"{url} answers, but not as a Candlewick server"
    if not isinstance(answer, dict) or "status" not in answer:
        return f"{url} answers, but not as a Candlewick server"
    return answer


__all__ = [
    "ServiceControl",
    "ServiceError",
    "ServiceState",
    "option",
    "probe_health",
    "run_command",
]
