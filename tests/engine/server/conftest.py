"""A live server on 127.0.0.1 (free port) over the real SmolLM2, shared by the server tests."""

from __future__ import annotations

import functools
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from app.services.discovery import DiscoveryRoots
from app.services.download_manager import DownloadManager
from app.services.hub import HubClient
from app.services.library import ModelLibrary
from app.services.server_models import LibraryModelStore
from engine.host.runtime import Model
from engine.server import ServedModel, ServerConfig, ServerState, ServerThread
from engine.server.openapi import openapi_schema
from engine.settings import LoadParams
from tests.hub_emulator import running_hub

API_KEY = "test-key-0123456789"


@functools.cache
def _tls() -> ssl.SSLContext:
    """httpx's default context, made once: each one-shot call would load the CA bundle again
    (~50 ms of CPU, for servers these tests reach over plain HTTP)."""
    return httpx.create_ssl_context()


class _Http:
    """httpx's one-shot helpers with a timeout for a busy 2-core machine (default is 5 s)."""

    def __getattr__(self, method: str) -> Any:
        def call(url: str, **kw: Any) -> httpx.Response:
            return httpx.request(method.upper(), url, timeout=120, verify=_tls(), **kw)

        return call


http = _Http()
N_SLOTS = 4


@pytest.fixture(scope="session")
def served(smollm2_path: Path) -> Iterator[ServedModel]:
    model = Model(smollm2_path, LoadParams(n_ctx=1024 * N_SLOTS, n_seq_max=N_SLOTS, n_threads=2))
    loaded = ServedModel.build(model, "smollm2", max_queue=32)
    yield loaded
    loaded.close()
    model.close()


def make_config(**kw: object) -> ServerConfig:
    base: dict[str, object] = {
        "port": 0,
        "api_key": API_KEY,
        "model_id": "smollm2",
        "max_tokens_cap": 64,
        "max_body_bytes": 64 * 1024,
        "cors_origins": ("http://app.example",),
    }
    base.update(kw)
    return ServerConfig(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def server(served: ServedModel) -> Iterator[ServerThread]:
    """The main server: API key required, one CORS origin allowed."""
    state = ServerState(make_config())
    state.set_loaded(served)
    with ServerThread(state) as srv:
        yield srv


@pytest.fixture
def base_url(server: ServerThread) -> str:
    return server.url


@pytest.fixture
def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {API_KEY}"}


@functools.cache
def open_document() -> dict[str, Any]:
    """The OpenAPI document of a server without a key (`ServerConfig(port=0)`), built once per
    process: each build walks every model's JSON schema (a quarter of a second on a busy
    machine). Callers only read it."""
    return openapi_schema(ServerConfig(port=0))


def doc_valid(name: str, body: dict[str, Any]) -> bool:
    """Whether the server's OpenAPI document takes `body` as its schema `name`."""
    doc = open_document()
    root = {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
    return jsonschema.Draft202012Validator(root).is_valid(body)


def assert_no_leak(loaded: ServedModel) -> None:
    sched = loaded.scheduler
    assert sched.wait_idle(60)
    snap = sched.snapshot()
    assert snap.busy_slots == 0 and snap.queue_depth == 0
    assert sched.kv_positions() == [s["cached_tokens"] for s in snap.slots]


@pytest.fixture
def model_store(tmp_path: Path) -> Iterator[LibraryModelStore]:
    """A real model store (pulls, copies, creates, deletes) over an empty library, its Hub
    the local emulator: nothing leaves this machine."""
    with running_hub() as hub:
        library = ModelLibrary(tmp_path / "models", bundled=False, discovery=DiscoveryRoots())
        downloads = DownloadManager(
            library.downloads_state, HubClient(hub.url), cache_dir=tmp_path / "hf"
        )
        try:
            yield LibraryModelStore(library, downloads)
        finally:
            downloads.close()
