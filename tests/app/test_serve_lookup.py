"""`candlewick serve --lookup`: the server drafts with prompt lookup for a lone request and
says so at startup, on /health and in /metrics."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from tests.engine.clients.bench_servers import candlewick_serve

QUOTE = (
    "The quick brown fox jumps over the lazy dog. The early bird catches the worm. "
    "Repeat both sentences exactly, then repeat them again."
)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as r:
        body: bytes = r.read()
        return body


def _metric(text: str, name: str) -> int:
    line = next(x for x in text.splitlines() if x.startswith(f"candlewick_{name} "))
    return int(float(line.split()[1]))


@pytest.mark.model
def test_serve_lookup_drafts(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with candlewick_serve(log, parallel=1, ctx=1024, extra=["--lookup"]) as (url, _pid):
        settings = json.loads(_get(url + "/health"))["settings"]
        assert settings["speculative"] == "lookup"
        body = json.dumps(
            {
                "model": "default",
                "temperature": 0,
                "max_tokens": 40,
                "messages": [{"role": "user", "content": QUOTE}],
            }
        ).encode()
        req = urllib.request.Request(
            url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=120) as r:
            reply = json.loads(r.read())
        # What SmolLM2 writes differs with the CPU's kernels (AVX2 machines drop the fox), so
        # the test asserts on the drafting, not on the model following the instruction.
        assert reply["choices"][0]["message"]["content"].strip()
        metrics = _get(url + "/metrics").decode()
        drafted = _metric(metrics, "draft_tokens_total")
        assert 0 < _metric(metrics, "draft_accepted_total") <= drafted
    assert "prompt lookup" in log.read_text()
