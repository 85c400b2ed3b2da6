"""The desktop's Local server settings, read without Qt, as the `candlewick serve` options
the background service runs with.

The window keeps them in its settings file (`window.ini` in the config folder, written by
QSettings in INI format): host, port, parallel slots, context per slot, whether a key is
required, and the library model last selected. The key itself is in the system keyring; a
service may start before the keyring is unlocked (at boot, with lingering), so
`candlewick service install` copies it to a file only the user can read, and serve reads it
with `--api-key-file`. Each model's own load settings are not copied: serve applies those
saved for the model itself (app.services.model_settings).
"""

from __future__ import annotations

import configparser
import contextlib
from dataclasses import dataclass
from pathlib import Path

from app.services.atomic_write import write_text_atomic
from app.services.paths import AppPaths

SETTINGS_FILE = "window.ini"  # the window's QSettings file (app.main.settings_for)
KEY_FILE = "service-api-key"
LOG_FILE = "service.log"
DEFAULT_MODEL = "default"


@dataclass(frozen=True)
class ServerProfile:
    """The Local server page's settings (its defaults where none are saved)."""

    host: str = "127.0.0.1"
    port: int = 8080
    parallel: int = 4
    ctx_per_slot: int = 4096
    require_key: bool = True
    model: str = DEFAULT_MODEL  # the library model the window had selected

    def serve_args(self, key_file: Path | None) -> list[str]:
        """`candlewick serve`'s arguments for these settings; `key_file` holds the key when
        one is required."""
        args = [
            "serve",
            "--model",
            self.model,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--parallel",
            str(self.parallel),
            "--ctx",
            str(self.ctx_per_slot),
        ]
        if self.require_key:
            if key_file is None:
                raise ValueError("the Local server requires an API key: a key file is needed")
            args += ["--api-key-file", str(key_file)]
        return args


def _ini(path: Path) -> configparser.ConfigParser:
    # QSettings' INI files are plain `key=value` under `[group]` for the values read here
    # (numbers, addresses, ids); configparser reads them. No interpolation: `%` is literal
    # to QSettings. Not strict: a hand-edited file with a repeated key keeps the last one.
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys keep their case
    with contextlib.suppress(FileNotFoundError):
        parser.read_string(path.read_text(encoding="utf-8"), source=str(path))
    return parser


def _text(parser: configparser.ConfigParser, group: str, key: str) -> str | None:
    value = parser.get(group, key, fallback=None)
    if value is None:
        return None
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':  # QSettings quotes some strings
        value = value[1:-1]
    return value or None


def read_profile(paths: AppPaths) -> ServerProfile:
    """The Local server's settings as the window last saved them; a value that is missing or
    not a number (a hand-edited file) keeps the page's default, as the page does. Raises
    OSError or configparser.Error for a file that cannot be read as INI."""
    ini = _ini(paths.config / SETTINGS_FILE)
    d = ServerProfile()

    def number(key: str, default: int) -> int:
        text = _text(ini, "server", key)
        try:
            return int(text) if text is not None else default
        except ValueError:
            return default

    require = _text(ini, "server", "require_key")
    return ServerProfile(
        host=_text(ini, "server", "host") or d.host,
        port=number("port", d.port),
        parallel=number("parallel", d.parallel),
        ctx_per_slot=number("ctx", d.ctx_per_slot),
        require_key=d.require_key if require is None else require == "true",
        model=_text(ini, "library", "selected") or d.model,
    )


def key_path(paths: AppPaths) -> Path:
    return paths.config / KEY_FILE


def log_path(paths: AppPaths) -> Path:
    return paths.logs / LOG_FILE


def write_key_file(paths: AppPaths, key: str) -> Path:
    """The key in a file only this user can read and write (0600 from its creation, so it is
    never readable by others, even for a moment); replaced whole."""
    path = key_path(paths)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, key + "\n", mode=0o600)
    return path


__all__ = [
    "ServerProfile",
    "key_path",
    "log_path",
    "read_profile",
    "write_key_file",
]
