"""Where Candlewick keeps its files, per the platform's conventions (platformdirs).

`CANDLEWICK_HOME` puts everything under one folder instead (tests, portable installs).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

APP_NAME = "candlewick"


@dataclass(frozen=True)
class AppPaths:
    data: Path
    config: Path
    cache: Path
    logs: Path

    @property
    def models(self) -> Path:
        return self.data / "models"

    def ensure(self) -> AppPaths:
        for p in (self.data, self.config, self.cache, self.logs, self.models):
            p.mkdir(parents=True, exist_ok=True)
        return self

    @classmethod
    def default(cls) -> AppPaths:
        home = os.environ.get("CANDLEWICK_HOME")
        if home:
            root = Path(home)
            return cls(root / "data", root / "config", root / "cache", root / "logs")
        return cls(
            Path(platformdirs.user_data_dir(APP_NAME, appauthor=False)),
            Path(platformdirs.user_config_dir(APP_NAME, appauthor=False)),
            Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False)),
            Path(platformdirs.user_log_dir(APP_NAME, appauthor=False)),
        )


def real_path(p: Path) -> Path:
    """`p` with its links resolved, the key that says two paths are one file; `p` itself
    where it cannot be resolved (a link loop, a folder that cannot be read)."""
    try:
        return p.resolve()
    except OSError:
        return p
