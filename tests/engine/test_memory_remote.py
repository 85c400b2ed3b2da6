"""Estimate a model served over HTTP from its header alone (Range requests, a real server)."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from engine.memory.estimate import estimate
from engine.memory.hardware import GiB, cpu_only
from engine.memory.params import EstimateParams
from engine.model.gguf import GGUFError, read_gguf
from engine.model.remote_gguf import HttpRangeSource, RemoteGGUFError, hf_url, read_remote_gguf
from engine.settings import LoadParams

PLENTY = cpu_only(64 * GiB)


@dataclass
class Served:
    files: dict[str, Path]  # URL path -> file
    honour_range: bool = True
    bytes_sent: int = 0
    requests: list[str] = field(default_factory=list)


def _handler(state: Served) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            state.requests.append(self.path)
            path = state.files.get(self.path)
            if path is None:
                self.send_error(404)
                return
            size = path.stat().st_size
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            if not state.honour_range or m is None:
                self.send_response(200)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                return  # the client must hang up without reading the body
            start = int(m.group(1))
            end = min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
            if start >= size:
                self.send_error(416)
                return
            with path.open("rb") as f:
                f.seek(start)
                data = f.read(end - start + 1)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            # Count before sending: the client may finish before this thread resumes.
            state.bytes_sent += len(data)
            self.wfile.write(data)

    return Handler


@pytest.fixture
def server(gemma_path: Path, smollm2_path: Path) -> Iterator[tuple[str, Served]]:
    state = Served(
        {
            "/models/gemma.gguf": gemma_path,
            "/models/smollm2.gguf": smollm2_path,
            "/unsloth/gemma-3-270m-GGUF/resolve/main/gemma-3-270m-Q4_K_M.gguf": gemma_path,
        }
    )
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    # shutdown() waits for the loop's next poll: 0.5 s by default
    thread = threading.Thread(
        target=httpd.serve_forever, name="range-server", kwargs={"poll_interval": 0.02}
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.mark.parametrize("name", ["gemma", "smollm2"])
def test_header_only_estimate_reads_under_5_percent(
    server: tuple[str, Served], name: str, request: pytest.FixtureRequest
) -> None:
    base, state = server
    local = Path(request.getfixturevalue(f"{name}_path"))
    head = read_remote_gguf(f"{base}/models/{name}.gguf")
    size = local.stat().st_size
    assert head.file_bytes == size
    assert state.bytes_sent == head.bytes_read  # nothing read that the client did not count
    assert head.bytes_read < 0.05 * size, (head.bytes_read, size)
    # The header read remotely is the header on disk, so the estimate is the same.
    params = EstimateParams(LoadParams(n_ctx=4096, n_gpu_layers=0))
    hw = cpu_only(64 * GiB)
    remote = estimate(head.gguf, params, hardware=hw)
    on_disk = estimate(local, params, hardware=hw, method="analytic")
    assert remote.method == "analytic"
    assert remote.total_bytes == on_disk.total_bytes
    assert len(head.gguf.tensors) == len(read_gguf(local).tensors)


def test_hub_reference_uses_the_endpoint(
    server: tuple[str, Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    base, state = server
    monkeypatch.setenv("HF_ENDPOINT", base)
    ref = "hf:unsloth/gemma-3-270m-GGUF/gemma-3-270m-Q4_K_M.gguf"
    assert hf_url(ref) == f"{base}/unsloth/gemma-3-270m-GGUF/resolve/main/gemma-3-270m-Q4_K_M.gguf"
    head = read_remote_gguf(ref)
    assert head.gguf.architecture == "gemma3"
    assert all("/resolve/main/" in p for p in state.requests)


def test_server_without_range_support_is_refused(server: tuple[str, Served]) -> None:
    base, state = server
    state.honour_range = False
    with pytest.raises(RemoteGGUFError, match="does not support range requests"):
        HttpRangeSource(f"{base}/models/gemma.gguf")
    assert state.bytes_sent == 0


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("/models/missing.gguf", "not found"),
        ("hf:only-owner/file.gguf", "not a Hub file reference"),
        ("ftp://example.org/x.gguf", "only http and https"),
    ],
)
def test_bad_remote_references(server: tuple[str, Served], ref: str, message: str) -> None:
    base, _ = server
    url = base + ref if ref.startswith("/") else ref
    with pytest.raises(GGUFError, match=message):
        read_remote_gguf(url)


def test_unreachable_host() -> None:
    with pytest.raises(RemoteGGUFError, match="cannot reach"):
        read_remote_gguf("http://127.0.0.1:9/model.gguf", timeout=2)


def write_split_model(folder: Path) -> tuple[Path, int]:
    """A tiny two-part GGUF in llama.cpp's split layout; returns part 1 and all tensor bytes."""
    import gguf
    import numpy as np

    # A coherent two-block llama (4 heads of 16, 2 KV heads): the estimate checks it.
    shapes = {
        "attn_norm": (64,),
        "attn_q": (64, 64),
        "attn_k": (32, 64),
        "attn_v": (32, 64),
        "attn_output": (64, 64),
        "ffn_norm": (64,),
        "ffn_gate": (128, 64),
        "ffn_up": (128, 64),
        "ffn_down": (64, 128),
    }
    tensors: list[dict[str, Any]] = [
        {
            "token_embd.weight": np.ones((100, 64), np.float32),
            "output_norm.weight": np.ones(64, np.float32),
        },
        {
            f"blk.{i}.{n}.weight": np.ones(shape, np.float32 if len(shape) == 1 else np.float16)
            for i in range(2)
            for n, shape in shapes.items()
        },
    ]
    n_all = sum(len(t) for t in tensors)
    first = folder / "tiny-00001-of-00002.gguf"
    for no, part in enumerate(tensors):
        w = gguf.GGUFWriter(str(folder / f"tiny-{no + 1:05d}-of-00002.gguf"), "llama")
        if no == 0:
            w.add_block_count(2)
            w.add_embedding_length(64)
            w.add_feed_forward_length(128)
            w.add_head_count(4)
            w.add_head_count_kv(2)
            w.add_context_length(512)
        w.add_uint16("split.no", no)
        w.add_uint16("split.count", 2)
        w.add_int32("split.tensors.count", n_all)
        for name, arr in part.items():
            w.add_tensor(name, arr)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    total = sum(arr.nbytes for part in tensors for arr in part.values())
    return first, total


def test_split_gguf_counts_every_part(tmp_path: Path) -> None:
    first, total = write_split_model(tmp_path)
    # The file's bytes alone: no AMX copies (counted in tests/engine/test_memory_split.py).
    est = estimate(
        first,
        EstimateParams(LoadParams(n_ctx=512, n_gpu_layers=0, extra_buffers=False)),
        hardware=PLENTY,
        method="analytic",
    )
    assert est.weights_bytes == total
    assert not est.notes
    # Only the first part on disk: the estimate says its weights are incomplete.
    (tmp_path / "tiny-00002-of-00002.gguf").rename(tmp_path / "elsewhere.gguf")
    with pytest.raises(GGUFError, match="not found"):
        estimate(first, EstimateParams(LoadParams(n_ctx=512)), hardware=PLENTY, method="analytic")
    partial = estimate(read_gguf(first), EstimateParams(LoadParams(n_ctx=512)), hardware=PLENTY)
    assert partial.weights_bytes < total and "split model" in partial.notes[0]


def test_split_gguf_over_http(server: tuple[str, Served], tmp_path: Path) -> None:
    base, state = server
    first, total = write_split_model(tmp_path)
    for part in sorted(tmp_path.glob("tiny-*.gguf")):
        state.files[f"/split/{part.name}"] = part
    head = read_remote_gguf(f"{base}/split/{first.name}")
    assert head.requests >= 4  # two parts: a size probe and the header of each
    assert head.file_bytes == sum(p.stat().st_size for p in tmp_path.glob("tiny-*.gguf"))
    est = estimate(
        head.gguf,
        EstimateParams(LoadParams(n_ctx=512, n_gpu_layers=0, extra_buffers=False)),
        hardware=PLENTY,
    )
    assert est.weights_bytes == total and not est.notes
