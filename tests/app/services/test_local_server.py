"""The desktop server's settings: the chat's context grown by the server's slots, the same
security rules as `candlewick serve`, a URL that works from this computer."""

from __future__ import annotations

import socket

import pytest

from app.services.local_server import ServeSettings, check_port_free, local_url, new_api_key
from engine.server import ServerError
from engine.settings import LoadParams


def test_load_params_keep_the_chats_settings_and_size_the_context() -> None:
    chat = LoadParams(
        n_ctx=2048, n_gpu_layers=7, n_threads=3, type_k="q8_0", flash_attn="on", state_cache_mb=256
    )
    # Three server slots beside the chat's, each as long as the chat's 2,048 tokens.
    p = ServeSettings(parallel=3, ctx_per_slot=1024).load_params(chat)
    assert (p.n_ctx, p.n_seq_max, p.state_cache_mb) == (4 * 2048, 4, 256)
    assert (p.n_gpu_layers, p.n_threads, p.type_k, p.flash_attn) == (7, 3, "q8_0", "on")
    # Server slots longer than the chat's make every slot that long.
    p = ServeSettings(parallel=2, ctx_per_slot=4096).load_params(chat)
    assert (p.n_ctx, p.n_seq_max) == (3 * 4096, 3)


def test_security_rules_are_the_servers() -> None:
    with pytest.raises(ServerError, match=r"refusing to listen on 0\.0\.0\.0 without an API key"):
        ServeSettings(host="0.0.0.0").config().validate()
    with pytest.raises(ServerError, match="too short"):
        ServeSettings(api_key="short").config().validate()
    ServeSettings(host="0.0.0.0", api_key=new_api_key()).config().validate()
    assert ServeSettings(api_key="").config().api_key is None  # an empty key is no key


def test_keys_are_random_and_long() -> None:
    keys = {new_api_key() for _ in range(50)}
    assert len(keys) == 50 and all(len(k) >= 40 and k.isprintable() for k in keys)


def test_urls_and_port_check() -> None:
    assert local_url("127.0.0.1", 8080) == "http://127.0.0.1:8080"
    assert local_url("0.0.0.0", 80) == "http://127.0.0.1:80"
    assert local_url("::", 81) == "http://[::1]:81"
    assert local_url("::1", 82) == "http://[::1]:82"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ServerError, match=rf"127\.0\.0\.1:{port}: Address already in use"):
            check_port_free("127.0.0.1", port)
    check_port_free("127.0.0.1", port)  # free again once closed
