"""`candlewick estimate`: the JSON contract, the table, simulated GPUs, remote files, bad input."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from engine.host.runtime import Model
from engine.settings import LoadParams

JSON_KEYS = {
    "weights_bytes",
    "kv_bytes",
    "compute_bytes",
    "output_bytes",
    "total_bytes",
    "devices",
    "gpu_layers",
    "verdict",
    "method",
}


def _run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["estimate", *args, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_json_contract_matches_a_real_load(
    capsys: pytest.CaptureFixture[str], smollm2_path: Path
) -> None:
    d = _run_json(capsys, "default", "--ctx", "2048", "--kv-type", "q8_0", "--gpu-layers", "0")
    assert set(d) >= JSON_KEYS
    assert d["method"] == "dry-run" and d["gpu_layers"] == 0
    assert d["total_bytes"] == (
        d["weights_bytes"] + d["kv_bytes"] + d["compute_bytes"] + d["output_bytes"]
    )
    assert [dev["name"] for dev in d["devices"]] == ["CPU"]
    assert d["devices"][0]["bytes"] == d["total_bytes"]
    assert d["verdict"] in ("ram_only", "does_not_fit")
    with Model(
        smollm2_path,
        LoadParams(n_ctx=2048, type_k="q8_0", type_v="q8_0", n_gpu_layers=0, n_threads=2),
    ) as m:
        actual = m.memory_actual.total_bytes
    assert abs(d["total_bytes"] - actual) < 0.05 * actual


def test_simulated_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    big = _run_json(capsys, "default", "--simulate-gpu", "24GiB", "--simulate-ram", "16GiB")
    assert big["verdict"] == "fits_gpu" and big["gpu_layers"] == big["n_layers"]
    assert [dev["name"] for dev in big["devices"]] == ["CPU", "GPU0"]
    tiny = _run_json(capsys, "default", "--simulate-gpu", "0.2GiB", "--method", "analytic")
    assert tiny["verdict"] == "ram_only" and tiny["method"] == "analytic"
    starved = _run_json(
        capsys,
        "default",
        "--ctx",
        "16384",
        "--simulate-ram",
        "300MiB",
        "--gpu-layers",
        "0",
        "--margin",
        "0",
        "--cache-ram",
        "0",
    )
    assert starved["verdict"] == "does_not_fit" and 0 < starved["max_ctx_fit"] < 16384
    assert starved["prompt_cache_bytes"] == 0  # --cache-ram 0: nothing but the buffers


def test_the_prompt_cache_is_named_and_counted(capsys: pytest.CaptureFixture[str]) -> None:
    """The RAM prompt cache's budget is overhead the fit counts, shown apart from llama.cpp's
    buffers (`total`) in the JSON and the table; --cache-ram sizes it."""
    args = ("default", "--ctx", "1024", "--gpu-layers", "0", "--method", "analytic")
    d = _run_json(capsys, *args, "--cache-ram", "100")
    off = _run_json(capsys, *args, "--cache-ram", "0")
    assert d["prompt_cache_bytes"] == d["overhead_bytes"] == 100 << 20
    assert d["total_bytes"] == off["total_bytes"] and off["prompt_cache_bytes"] == 0
    cpu = d["devices"][0]
    assert cpu["required_bytes"] - cpu["margin_bytes"] == d["total_bytes"] + (100 << 20)
    assert main(["estimate", *args]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\+ cache +256\.0 MiB +\(prompt cache in RAM", out), out
    assert "GPU driver" not in out


def test_human_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "default", "--ctx", "1024", "--simulate-gpu", "1GiB"]) == 0
    out = capsys.readouterr().out
    for label in ("weights", "KV cache", "compute", "output", "total", "Verdict:", "GPU0 (sim)"):
        assert label in out
    assert re.search(r"GPU layers: \d+ of 31", out)


@pytest.fixture
def range_server(gemma_path: Path) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            m = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
            if not self.path.endswith("/resolve/main/gemma.gguf") or m is None:
                self.send_error(404)
                return
            size = gemma_path.stat().st_size
            start, end = int(m.group(1)), min(int(m.group(2)), size - 1)
            with gemma_path.open("rb") as f:
                f.seek(start)
                data = f.read(end - start + 1)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    # shutdown() waits for the loop's next poll: 0.5 s by default
    thread = threading.Thread(
        target=httpd.serve_forever, name="range-server", kwargs={"poll_interval": 0.02}
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_hub_file_before_download(
    capsys: pytest.CaptureFixture[str],
    range_server: str,
    monkeypatch: pytest.MonkeyPatch,
    gemma_path: Path,
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", range_server)
    d = _run_json(capsys, "hf:google/gemma-3-270m-GGUF/gemma.gguf", "--ctx", "4096")
    assert d["method"] == "analytic"
    assert d["file_bytes"] == gemma_path.stat().st_size
    assert d["bytes_read"] < 0.05 * d["file_bytes"]
    local = _run_json(capsys, str(gemma_path), "--ctx", "4096", "--method", "analytic")
    assert d["total_bytes"] == local["total_bytes"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["no-such-model"], "no model called"),
        (["/nowhere/model.gguf"], "not found"),
        (["default", "--kv-type", "q8_0", "--flash-attn", "off"], "flash attention"),
        (["hf:owner/file.gguf"], "not a Hub file reference"),
        (["http://127.0.0.1:9/x.gguf", "--method", "dry-run"], "dry run needs the file"),
    ],
)
def test_bad_input_is_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["estimate", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_not_a_gguf(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "notes.gguf"
    bad.write_text("<html>oops</html>")
    assert main(["estimate", str(bad)]) == 2
    assert "not a GGUF model" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args",
    [
        ["default", "--ctx", "lots"],
        ["default", "--simulate-gpu", "huge"],
        ["default", "--gpu-layers", "-3"],
    ],
)
def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["estimate", *args])
    assert exc.value.code == 2
    assert "Traceback" not in capsys.readouterr().err
