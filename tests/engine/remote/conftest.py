"""Real OpenAI-compatible servers for the remote engine tests, started once per session.

- `candlewick serve` (a subprocess, SmolLM2, an API key required), which also speaks Ollama;
- llama-cpp-python's bundled server (`python -m llama_cpp.server`, through the wrapper that
  keeps it from crashing on AMX CPUs).

Both are stopped when the session ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.remote.engines import RemoteEndpoint
from tests.engine.clients.bench_servers import candlewick_serve, llama_cpp_server

API_KEY = "remote-test-key-0123"


@pytest.fixture(scope="session")
def candlewick_server(
    tmp_path_factory: pytest.TempPathFactory,
    smollm2_path: Path,  # what the child serves: its tests are marked `model`
) -> Iterator[tuple[str, int]]:
    log = tmp_path_factory.mktemp("candlewick-serve") / "server.log"
    with candlewick_serve(log, parallel=2, ctx=2048, api_key=API_KEY) as server:
        yield server


@pytest.fixture(scope="session")
def llama_server(
    smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, int]]:
    log = tmp_path_factory.mktemp("llama-cpp-server") / "server.log"
    # interrupt=False: a second request waits instead of cutting the running answer short.
    with llama_cpp_server(smollm2_path, log, interrupt=False) as server:
        yield server


@pytest.fixture
def candlewick_endpoint(candlewick_server: tuple[str, int]) -> RemoteEndpoint:
    return RemoteEndpoint(
        name="local-serve",
        base_url=candlewick_server[0],
        api="openai",
        api_key=API_KEY,
        timeout_s=120,
    )


@pytest.fixture
def llama_endpoint(llama_server: tuple[str, int]) -> RemoteEndpoint:
    return RemoteEndpoint(name="llama-cpp", base_url=llama_server[0], api="openai", timeout_s=120)
