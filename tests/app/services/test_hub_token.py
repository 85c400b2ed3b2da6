"""The Hub token: OS keyring when there is one, this session only when there is not."""

from __future__ import annotations

import logging

import pytest
from keyring.backends import fail

from app.services.secrets import ACCOUNT, SERVICE, RedactingFilter, TokenStore
from tests.memory_keyring import MemoryKeyring


def test_token_goes_to_the_keyring_and_survives_a_restart() -> None:
    backend = MemoryKeyring()
    store = TokenStore(backend)
    assert store.keyring_available
    result = store.set("  hf_abc123  ")
    assert result.persisted and "keyring" in result.message
    assert backend.store[(SERVICE, ACCOUNT)] == "hf_abc123"
    assert TokenStore(backend).get() == "hf_abc123"  # a new session reads it back
    store.clear()
    assert TokenStore(backend).get() is None
    store.clear()  # clearing twice is fine


def test_without_a_keyring_the_token_lives_for_the_session_only() -> None:
    store = TokenStore(fail.Keyring())  # type: ignore[no-untyped-call]
    assert not store.keyring_available
    assert "session only" in store.describe_storage()
    result = store.set("hf_session")
    assert not result.persisted and "this session only" in result.message
    assert store.get() == "hf_session"
    fresh = TokenStore(fail.Keyring())  # type: ignore[no-untyped-call]
    assert fresh.get() is None  # gone with the session


def test_bad_token_text_is_refused() -> None:
    with pytest.raises(ValueError, match="does not look like"):
        TokenStore(MemoryKeyring()).set("hf abc")


def test_redaction_in_text_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    store = TokenStore(MemoryKeyring())
    store.set("hf_TOPSECRET")
    assert store.redact("Authorization: Bearer hf_TOPSECRET") == "Authorization: Bearer hf_***"
    logger = logging.getLogger("candlewick.test_token")
    flt = RedactingFilter(store)
    logger.addFilter(flt)
    try:
        with caplog.at_level(logging.INFO, logger="candlewick.test_token"):
            logger.info("header %s", "Bearer hf_TOPSECRET")
    finally:
        logger.removeFilter(flt)
    assert "hf_TOPSECRET" not in caplog.text and "Bearer hf_***" in caplog.text
