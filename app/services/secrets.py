"""Secrets: the Hugging Face access token and the API keys of remote connections. Kept in the
OS keyring, never in a config file or a log.

When no keyring backend exists (a minimal Linux without a Secret Service, a headless box) the
token lives in memory for this session only and the user is told so. `redact` scrubs it from
any text that might be shown or logged (error messages quote URLs and headers).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import keyring
import keyring.backend
import keyring.errors

SERVICE = "candlewick"
ACCOUNT = "huggingface-hub-token"
log = logging.getLogger("candlewick.secrets")


@dataclass(frozen=True)
class SaveResult:
    persisted: bool  # True: in the keyring; False: this session only
    message: str


class SecretStore:
    """Named secrets (the API keys of remote connections) in the OS keyring, under service
    "candlewick" and the given account name. Without a keyring they live in memory for this
    session only; `set` says which happened. Nothing here ever writes a secret to a file."""

    def __init__(self, backend: keyring.backend.KeyringBackend | None = None) -> None:
        self._backend = backend
        self._session: dict[str, str] = {}

    @property
    def backend(self) -> keyring.backend.KeyringBackend:
        return self._backend or keyring.get_keyring()

    @property
    def keyring_available(self) -> bool:
        b = self.backend
        # The "fail" backend (and anything with priority < 1) cannot store secrets.
        return type(b).__module__ != "keyring.backends.fail" and _priority(b) >= 1

    def get(self, account: str) -> str | None:
        if account in self._session:
            return self._session[account]
        if not self.keyring_available:
            return None
        try:
            return self.backend.get_password(SERVICE, account) or None
        except keyring.errors.KeyringError as e:
            log.warning("keyring read failed: %s", type(e).__name__)
            return None

    def set(self, account: str, secret: str) -> SaveResult:
        if self.keyring_available:
            try:
                self.backend.set_password(SERVICE, account, secret)
                self._session.pop(account, None)
                return SaveResult(
                    True, f"saved in the system keyring ({type(self.backend).__name__})"
                )
            except keyring.errors.KeyringError as e:
                log.warning("keyring write failed: %s", type(e).__name__)
        self._session[account] = secret
        return SaveResult(False, "no system keyring is available: kept for this session only")

    def delete(self, account: str) -> None:
        self._session.pop(account, None)
        if self.keyring_available:
            try:
                self.backend.delete_password(SERVICE, account)
            except keyring.errors.PasswordDeleteError:
                pass
            except keyring.errors.KeyringError as e:
                log.warning("keyring delete failed: %s", type(e).__name__)


class TokenStore:
    """Get/set/clear the Hub token. `backend` is a keyring backend (the OS default if None)."""

    def __init__(self, backend: keyring.backend.KeyringBackend | None = None) -> None:
        self._secrets = SecretStore(backend)

    @property
    def backend(self) -> keyring.backend.KeyringBackend:
        return self._secrets.backend

    @property
    def keyring_available(self) -> bool:
        return self._secrets.keyring_available

    def describe_storage(self) -> str:
        if self.keyring_available:
            return f"saved in the system keyring ({type(self.backend).__name__})"
        return (
            "no system keyring is available: the token is kept for this session only and "
            "must be entered again next time"
        )

    def get(self) -> str | None:
        return self._secrets.get(ACCOUNT)

    def set(self, token: str) -> SaveResult:
        token = token.strip()
        if not token:
            self.clear()
            return SaveResult(False, "Hub token removed")
        if any(c.isspace() for c in token) or len(token) > 1024:
            raise ValueError(
                "that does not look like a Hugging Face token (it has spaces or is too long)"
            )
        saved = self._secrets.set(ACCOUNT, token)
        if saved.persisted:
            return SaveResult(True, "Hub token " + saved.message)
        return SaveResult(
            False, "no system keyring is available: the Hub token is kept for this session only"
        )

    def clear(self) -> None:
        self._secrets.delete(ACCOUNT)

    def redact(self, text: str) -> str:
        token = self.get()
        return text.replace(token, "hf_***") if token else text


class RedactingFilter(logging.Filter):
    """A logging filter that replaces the token in every record (install on handlers)."""

    def __init__(self, store: TokenStore) -> None:
        super().__init__()
        self.store = store

    def filter(self, record: logging.LogRecord) -> bool:
        token = self.store.get()
        if token:
            msg = record.getMessage()
            if token in msg:
                record.msg, record.args = msg.replace(token, "hf_***"), None
        return True


def _priority(backend: Any) -> float:
    try:
        return float(backend.priority)
    except Exception:
        return 0.0
