"""`candlewick service install|uninstall|start|stop|status|logs`: keep serving without a window.

The service runs `candlewick serve` (this install's own executable, by its absolute path) with
the desktop's Local server settings (app.services.server_profile) and the model last selected
in the window, at login, through the platform's manager (app.services.service_control): a
systemd user unit on Linux, a LaunchAgent on macOS, a Task Scheduler task on Windows. The
settings are written into the definition: after changing them in the window, install again
(`status` says when they differ). Without a manager to call (no systemd user manager), the
definition is still written, and start/stop/status say so in one line with the command to run.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.cli.common import CliError, library, positive_int
from app.services.paths import AppPaths
from app.services.server_profile import (
    ServerProfile,
    key_path,
    log_path,
    read_profile,
    write_key_file,
)
from app.services.service_control import (
    ServiceControl,
    ServiceError,
    ServiceState,
    option,
    probe_health,
)
from app.services.service_log import follow, tail
from app.services.service_units import ServiceSpec, carried_env, launcher

PLATFORMS = {"linux": "linux", "macos": "darwin", "windows": "win32"}
NOT_RUNNING = 3  # status's exit code when no server answers (as `systemctl status`)
LAUNCHD_LOG = "service-launchd.log"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "service",
        help="run the server in the background at login (systemd, launchd, Task Scheduler)",
        description="A per-user service that runs `candlewick serve` with the Local server's "
        "settings from the desktop app.",
    )
    actions = p.add_subparsers(dest="service_action", metavar="ACTION", required=True)
    inst = actions.add_parser("install", help="write the service and start it at login")
    inst.add_argument(
        "--model",
        default=None,
        help="the model to serve (default: the one last selected in the window, else 'default')",
    )
    inst.add_argument(
        "--print",
        dest="print_only",
        action="store_true",
        help="print the definition instead of writing it",
    )
    inst.add_argument(
        "--platform",
        choices=sorted(PLATFORMS),
        default=None,
        help="with --print: the definition for this platform (default: this one)",
    )
    inst.set_defaults(handler=install)
    for name, handler, text in (
        ("uninstall", uninstall, "stop the service and remove it"),
        ("start", start, "start the service now"),
        ("stop", stop, "stop the service"),
        ("status", status, "the service's state and what its server answers"),
    ):
        actions.add_parser(name, help=text).set_defaults(handler=handler)
    logs = actions.add_parser("logs", help="the end of the service's log")
    logs.add_argument("-n", "--lines", type=positive_int, default=50, help="how many (50)")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="then print new lines as they come"
    )
    logs.set_defaults(handler=show_logs)


def _control(platform: str | None = None) -> ServiceControl:
    return ServiceControl(platform=platform)


def saved_key_file(paths: AppPaths, profile: ServerProfile) -> Path | None:
    """Where the service reads its key (None: none is required): the window's, from the
    keyring (a new one, saved there too, the first time), copied to a file only the user can
    read."""
    if not profile.require_key:
        return None
    from app.services.local_server import KEY_ACCOUNT, new_api_key
    from app.services.secrets import SecretStore

    secrets = SecretStore()
    key = secrets.get(KEY_ACCOUNT)
    if key is None:
        key = new_api_key()
        secrets.set(KEY_ACCOUNT, key)  # the window then shows the key clients use
    return write_key_file(paths, key)


def service_spec(paths: AppPaths, profile: ServerProfile, key_file: Path | None) -> ServiceSpec:
    """The command the service runs for `profile`, from the home folder."""
    log = log_path(paths)
    argv = (*launcher(), *profile.serve_args(key_file), "--log-file", str(log))
    return ServiceSpec(argv, carried_env(), Path.home(), log)


def _check_profile(profile: ServerProfile) -> None:
    """What serve would refuse at every start, refused now instead of in a restart loop."""
    from engine.server import ServerConfig

    library().resolve(profile.model)  # one line when the model is not in the library
    placeholder = "x" * 16 if profile.require_key else None  # the key's own checks: serve's
    ServerConfig(host=profile.host, port=profile.port, api_key=placeholder).validate()


def install(args: argparse.Namespace) -> int:
    paths = AppPaths.default().ensure()
    profile = read_profile(paths)
    if args.model:
        profile = replace(profile, model=args.model)
    _check_profile(profile)
    platform = PLATFORMS[args.platform] if args.platform else None
    if platform is not None and not args.print_only:
        raise CliError("--platform is for --print: a service is installed for this platform")
    control = _control(platform)
    if args.print_only:  # the keyring untouched, no file written
        key_file = key_path(paths) if profile.require_key else None
        spec = service_spec(paths, profile, key_file)
        sys.stdout.buffer.write(control.definition_text(spec, paths.logs / LAUNCHD_LOG))
        sys.stdout.flush()
        return 0
    spec = service_spec(paths, profile, saved_key_file(paths, profile))
    print(control.install(spec, paths.logs / LAUNCHD_LOG))
    print(f"serves {describe(profile)}; log: {spec.log_file}")
    return 0


def describe(profile: ServerProfile) -> str:
    key = "an API key required" if profile.require_key else "no API key"
    return (
        f"'{profile.model}' on {profile.host}:{profile.port} ({profile.parallel} slots of "
        f"{profile.ctx_per_slot} tokens, {key})"
    )


def uninstall(args: argparse.Namespace) -> int:
    print(_control().uninstall())
    key_path(AppPaths.default()).unlink(missing_ok=True)  # the window keeps it in the keyring
    return 0


def start(args: argparse.Namespace) -> int:
    try:
        print(_control().start())
    except ServiceError as e:
        raise CliError(str(e)) from None
    return 0


def stop(args: argparse.Namespace) -> int:
    try:
        print(_control().stop())
    except ServiceError as e:
        raise CliError(str(e)) from None
    return 0


def status(args: argparse.Namespace) -> int:
    profile = read_profile(AppPaths.default())
    control = _control()
    state = control.state()
    for line in status_lines(state, control, profile):
        print(line)
    host, port = _address(state, profile)
    answer = probe_health(_local_url(host, port))
    print(server_line(answer, _local_url(host, port)))
    return 0 if isinstance(answer, dict) and answer.get("status") == "ok" else NOT_RUNNING


def status_lines(state: ServiceState, control: ServiceControl, profile: ServerProfile) -> list[str]:
    """The service's part of `status`: its state, the manager's absence and what to do
    instead, the command, and settings changed in the window since it was installed."""
    lines = [f"service: {state.state} ({state.definition})"]
    if state.problem is not None:
        lines.append(f"manager: {state.problem}; {control.instead()}")
    if state.argv is not None:
        lines.append(f"command: {shlex.join(state.argv)}")
        changed = [
            f"{name} {now}"
            for name, flag, now in (
                ("model", "--model", profile.model),
                ("host", "--host", profile.host),
                ("port", "--port", str(profile.port)),
                ("slots", "--parallel", str(profile.parallel)),
                ("context per slot", "--ctx", str(profile.ctx_per_slot)),
            )
            if option(state.argv, flag, "") != now
        ]
        if profile.require_key != ("--api-key-file" in state.argv):
            changed.append("an API key " + ("required" if profile.require_key else "not required"))
        if changed:
            lines.append(
                f"note: the Local server's settings changed since install ({', '.join(changed)} "
                "now): run `candlewick service install` again to apply them"
            )
    return lines


def _address(state: ServiceState, profile: ServerProfile) -> tuple[str, int]:
    """Where the server listens: the installed command's address, else the window's."""
    if state.argv is None:
        return profile.host, profile.port
    try:
        return option(state.argv, "--host", "127.0.0.1"), int(option(state.argv, "--port", "8080"))
    except ValueError:
        return profile.host, profile.port


def _local_url(host: str, port: int) -> str:
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host in ("::", "[::]"):
        host = "::1"
    if ":" in host:
        host = f"[{host.strip('[]')}]"
    return f"http://{host}:{port}"


def server_line(answer: dict[str, Any] | str, url: str) -> str:
    """The server's part of `status`, from its /health answer."""
    if isinstance(answer, str):
        return f"server: {answer}"
    if answer.get("status") != "ok":
        why = f": {answer['error']}" if answer.get("error") else ""
        return f"server: {answer.get('status')} at {url}{why}"
    models = answer.get("models") or []
    listed = ", ".join(f"{m.get('name')} ({m.get('state')})" for m in models) or "none loaded"
    slots = ""
    if answer.get("slots_total") is not None:
        slots = f"; slots {answer.get('slots_busy')} of {answer['slots_total']} busy"
    return f"server: ok at {url}; models: {listed}{slots}"


def show_logs(args: argparse.Namespace) -> int:
    path = log_path(AppPaths.default())
    if not path.exists() and not args.follow:
        raise CliError(f"no service log yet ({path}): the service writes it once it starts")
    for line in tail(path, args.lines):
        print(line)
    if args.follow:
        sys.stdout.flush()
        with contextlib.suppress(KeyboardInterrupt):
            for line in follow(path):
                print(line, flush=True)
    return 0
