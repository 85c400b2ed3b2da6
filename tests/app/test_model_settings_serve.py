"""`candlewick serve` loads a model a request names with the settings saved for it, under the
options typed on the command line: flag > saved for this model > the options' defaults."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from app.cli import build_parser, serve_cmd
from app.cli.common import library
from app.services.model_settings import ModelSettingsStore
from engine.host.host import ModelHost
from engine.server import ServerState, ServerThread
from tests.engine.clients.bench_servers import candlewick_serve
from tests.engine.server.conftest import API_KEY, http, make_config

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def served_meta(url: str, name: str) -> dict[str, Any]:
    models = http.get(url + "/v1/models", headers=AUTH).json()["data"]
    meta: dict[str, Any] = next(m for m in models if m["id"] == name)["meta"]
    return meta


@pytest.mark.slow
def test_a_request_naming_a_model_loads_it_with_its_saved_settings(smollm2_path: Path) -> None:
    ModelSettingsStore.for_paths().save(
        smollm2_path, {"n_ctx": 768, "type_k": "q8_0", "type_v": "q8_0", "n_threads": 1}
    )
    entry = next(e for e in library().entries() if e.path == smollm2_path)
    # --kv-type is typed: it wins; --ctx is left at its default: the saved context wins.
    args = build_parser("serve").parse_args(
        ["serve", "--parallel", "2", "--threads", "2", "--kv-type", "f16", "--cache-ram", "0"]
    )
    params = serve_cmd.serve_load_params(args)
    host = ModelHost(serve_cmd.catalog(params, None, serve_cmd.saved_settings(args, params)))
    state = ServerState(make_config(max_tokens_cap=8), host=host)
    srv = ServerThread(state).start()
    try:
        assert host.loads == 0
        r = http.post(
            srv.url + "/v1/chat/completions",
            headers=AUTH,
            json={
                "model": entry.slug,  # by name, as an API client asks
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 2,
                "temperature": 0,
            },
        )
        assert r.status_code == 200, r.text
        assert host.loads == 1
        meta = served_meta(srv.url, entry.id)
        assert (meta["slots"], meta["ctx_per_slot"]) == (2, 768)
        assert (meta["kv_type_k"], meta["kv_type_v"], meta["threads"]) == ("f16", "f16", 2)
        ps = http.get(srv.url + "/api/ps", headers=AUTH).json()["models"]
        assert [m["model"] for m in ps] == [entry.id]
    finally:
        srv.stop()
        state.close()
        host.close()


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read())


@pytest.mark.model
def test_serve_starts_its_model_with_the_saved_settings(tmp_path: Path, smollm2_path: Path) -> None:
    # The child reads the same profile (CANDLEWICK_HOME). It is started with --ctx 1024 and
    # --threads 2: those stay; the saved cache types apply.
    ModelSettingsStore.for_paths().save(
        smollm2_path, {"n_ctx": 768, "type_k": "q8_0", "type_v": "q8_0"}
    )
    log = tmp_path / "server.log"
    with candlewick_serve(log, parallel=1, ctx=1024) as (url, _pid):
        settings = _get(url + "/health")["settings"]
    assert (settings["ctx_per_slot"], settings["threads"]) == (1024, 2)
    assert (settings["kv_type_k"], settings["kv_type_v"]) == ("q8_0", "q8_0")
    assert "settings saved for this model" in log.read_text()
