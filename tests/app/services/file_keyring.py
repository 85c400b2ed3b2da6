"""A keyring backend for tests: a JSON file named by $CANDLEWICK_TEST_KEYRING.

It goes through the real keyring API (also in `candlewick` subprocesses, selected with
PYTHON_KEYRING_BACKEND=tests.app.services.file_keyring.FileKeyring), and it lives outside the
app's folders, so a test can prove that a key never lands in Candlewick's own files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import keyring.backend
import keyring.errors

BACKEND = "tests.app.services.file_keyring.FileKeyring"


class FileKeyring(keyring.backend.KeyringBackend):
    priority = 1  # type: ignore[assignment]

    def __init__(self, path: Path | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        env = os.environ.get("CANDLEWICK_TEST_KEYRING")
        if path is None and not env:
            # keyring tries every imported backend class when it looks for the system's
            # keyring and skips those that raise TypeError ("needs parameters"): a later test
            # in the same process must get the real keyring, not a crash.
            raise TypeError("FileKeyring needs a path or $CANDLEWICK_TEST_KEYRING")
        self.path = path or Path(str(env))

    def _load(self) -> dict[str, str]:
        try:
            return dict(json.loads(self.path.read_text()))
        except FileNotFoundError:
            return {}

    def get_password(self, service: str, username: str) -> str | None:
        return self._load().get(f"{service}/{username}")

    def set_password(self, service: str, username: str, password: str) -> None:
        data = self._load()
        data[f"{service}/{username}"] = password
        self.path.write_text(json.dumps(data))

    def delete_password(self, service: str, username: str) -> None:
        data = self._load()
        if data.pop(f"{service}/{username}", None) is None:
            raise keyring.errors.PasswordDeleteError("not set")
        self.path.write_text(json.dumps(data))
