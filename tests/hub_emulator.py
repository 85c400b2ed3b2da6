"""A local Hugging Face Hub for tests: real HTTP, real GGUF bytes, injectable faults.

It answers the calls huggingface_hub and Candlewick make:
  GET  /api/models?search=&filter=&sort=&limit=        search
  GET  /api/models/{repo}[/revision/{rev}]?blobs=true  model info with siblings + LFS sha256
  GET  /api/models/{repo}/tree/{rev}                   file tree
  HEAD/GET /{repo}/resolve/{rev}/{path}                 302 to /cdn/{sha256} for LFS files
  GET  /cdn/{sha256}                                   the bytes, honouring Range
Faults: `drop_after` (close the connection mid-file), `corrupt` (serve bytes that differ from
the advertised hash), `hold_at` (stall mid-file until released), gated repos (401 without a
token, 403 with one that was not granted), unknown repos/files (404).
It speaks HTTP/1.0 (one request per connection) so no handler thread outlives a test.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlparse

CHUNK = 256 * 1024


@dataclass
class EmuFile:
    path: str
    data: bytes | None = None
    source: Path | None = None  # served from disk without loading it into memory
    lfs: bool = True
    _sha: str | None = None

    @property
    def size(self) -> int:
        if self.data is not None:
            return len(self.data)
        assert self.source is not None
        return self.source.stat().st_size

    @property
    def sha256(self) -> str:
        if self._sha is None:
            if self.data is not None:
                self._sha = hashlib.sha256(self.data).hexdigest()
            else:
                assert self.source is not None
                self._sha = file_sha256(self.source)
        return self._sha

    @property
    def git_sha1(self) -> str:
        body = self.read(0, self.size)
        return hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest()

    def read(self, offset: int, n: int) -> bytes:
        if self.data is not None:
            return self.data[offset : offset + n]
        assert self.source is not None
        with open(self.source, "rb") as f:
            return os.pread(f.fileno(), n, offset)


@dataclass
class EmuRepo:
    repo_id: str
    files: dict[str, EmuFile] = field(default_factory=dict)
    sha: str = "0123456789abcdef0123456789abcdef01234567"
    gated: bool = False
    granted_tokens: set[str] = field(default_factory=set)
    downloads: int = 0
    likes: int = 0
    last_modified: str = "2026-01-01T00:00:00.000Z"
    tags: list[str] = field(default_factory=lambda: ["gguf"])
    license: str | None = "apache-2.0"

    def add(
        self, path: str, data: bytes | None = None, source: Path | None = None, lfs: bool = True
    ) -> EmuFile:
        f = EmuFile(path, data, source, lfs)
        self.files[path] = f
        return f


class HubEmulator:
    def __init__(self) -> None:
        self.repos: dict[str, EmuRepo] = {}
        self.lock = threading.Lock()
        self.drop_after: dict[tuple[str, str], int] = {}  # (repo, path) -> bytes, one shot
        self.corrupt: set[tuple[str, str]] = set()
        self.hold_at: dict[tuple[str, str], int] = {}  # stall after N bytes until released
        self.released = threading.Event()
        self.held = threading.Event()  # set when a transfer reached its hold point
        self.requests: list[dict[str, Any]] = []
        self._servers: list[ThreadingHTTPServer] = []
        self._threads: list[threading.Thread] = []

    def repo(self, repo_id: str, **kw: Any) -> EmuRepo:
        r = EmuRepo(repo_id, **kw)
        self.repos[repo_id] = r
        return r

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._servers[0].server_address[1]}"

    @property
    def cdn_url(self) -> str:
        """A second origin, like the real Hub's CDN: huggingface_hub does not follow a
        redirect to another origin in its HEAD call, and httpx drops Authorization there."""
        return f"http://127.0.0.1:{self._servers[1].server_address[1]}"

    def start(self) -> HubEmulator:
        emu = self

        class Handler(_Handler):
            emulator = emu

        for name in ("hub-emulator", "hub-emulator-cdn"):
            server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            server.daemon_threads = True
            t = threading.Thread(
                target=server.serve_forever, name=name, kwargs={"poll_interval": 0.05}
            )
            self._servers.append(server)
            self._threads.append(t)
            t.start()
        return self

    def stop(self) -> None:
        self.released.set()
        for server in self._servers:
            server.shutdown()
            server.server_close()
        for t in self._threads:
            t.join()

    def file_requests(self, path: str) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.requests if r["method"] == "GET" and r.get("file") == path]


@contextmanager
def running_hub() -> Iterator[HubEmulator]:
    emu = HubEmulator().start()
    try:
        yield emu
    finally:
        emu.stop()


_RANGE_RE = re.compile(r"bytes=(\d+)-(\d*)")


class _Handler(BaseHTTPRequestHandler):
    emulator: HubEmulator
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    # --- helpers ---
    def _json(self, obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str) -> None:
        self._json({"error": message}, status, {"X-Error-Code": code, "X-Error-Message": message})

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        return auth[7:] if auth.startswith("Bearer ") else None

    def _access(self, repo: EmuRepo) -> bool:
        """Gated repos: 401 without a token, 403 with a token that was not granted."""
        if not repo.gated:
            return True
        token = self._token()
        if token is None:
            self._error(
                401,
                "GatedRepo",
                f"Access to model {repo.repo_id} is restricted. "
                "You must be authenticated to access it.",
            )
            return False
        if token not in repo.granted_tokens:
            self._error(
                403,
                "GatedRepo",
                f"Access to model {repo.repo_id} is restricted and "
                "you are not in the authorized list.",
            )
            return False
        return True

    def _record(self, **extra: Any) -> None:
        with self.emulator.lock:
            self.emulator.requests.append(
                {
                    "method": self.command,
                    "path": self.path,
                    "range": self.headers.get("Range"),
                    "auth": self._token() is not None,
                    **extra,
                }
            )

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        url = urlparse(self.path)
        path = unquote(url.path)
        query = parse_qs(url.query)
        try:
            if path == "/api/models":
                self._record()
                return self._search(query)
            m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
            if m:
                self._record()
                return self._info(m[1])
            m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/.*)?", path)
            if m:
                self._record()
                return self._tree(m[1])
            m = re.fullmatch(r"/cdn/([0-9a-f]{64})/(.+)", path)
            if m:
                return self._cdn(m[1], m[2])
            m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
            if m:
                self._record(file=m[3])
                return self._resolve(m[1], m[3])
            self._error(404, "NotFound", "no such endpoint")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away (cancel, pause): nothing to answer

    # --- endpoints ---
    def _search(self, query: dict[str, list[str]]) -> None:
        text = (query.get("search") or [""])[0].lower()
        filters = query.get("filter") or []
        sort = (query.get("sort") or ["downloads"])[0]
        limit = int((query.get("limit") or ["1000"])[0])
        found = [
            r
            for r in self.emulator.repos.values()
            if text in r.repo_id.lower() and all(f in r.tags for f in filters)
        ]
        key = {"likes": lambda r: r.likes, "lastModified": lambda r: r.last_modified}.get(
            sort, lambda r: r.downloads
        )
        found.sort(key=key, reverse=True)  # type: ignore[arg-type]
        self._json(
            [
                {
                    "id": r.repo_id,
                    "_id": r.repo_id,
                    "modelId": r.repo_id,
                    "likes": r.likes,
                    "downloads": r.downloads,
                    "lastModified": r.last_modified,
                    "gated": r.gated,
                    "private": False,
                    "tags": r.tags,
                    "library_name": "gguf",
                }
                for r in found[:limit]
            ]
        )

    def _repo(self, repo_id: str) -> EmuRepo | None:
        repo = self.emulator.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
        return repo

    def _info(self, repo_id: str) -> None:
        repo = self._repo(repo_id)
        if repo is None:
            return
        siblings = []
        for f in repo.files.values():
            s: dict[str, Any] = {"rfilename": f.path, "size": f.size if not f.lfs else 135}
            s["blobId"] = f.git_sha1 if not f.lfs else hashlib.sha1(f.path.encode()).hexdigest()
            if f.lfs:
                s["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": 135}
            siblings.append(s)
        card = {"license": repo.license} if repo.license else {}
        self._json(
            {
                "id": repo.repo_id,
                "_id": repo.repo_id,
                "modelId": repo.repo_id,
                "sha": repo.sha,
                "gated": "manual" if repo.gated else False,
                "private": False,
                "downloads": repo.downloads,
                "likes": repo.likes,
                "lastModified": repo.last_modified,
                "tags": repo.tags,
                "cardData": card,
                "siblings": siblings,
            }
        )

    def _tree(self, repo_id: str) -> None:
        repo = self._repo(repo_id)
        if repo is None:
            return
        self._json(
            [
                {
                    "type": "file",
                    "path": f.path,
                    "size": f.size,
                    "oid": hashlib.sha1(f.path.encode()).hexdigest(),
                    **(
                        {"lfs": {"oid": f.sha256, "size": f.size, "pointerSize": 135}}
                        if f.lfs
                        else {}
                    ),
                }
                for f in repo.files.values()
            ]
        )

    def _resolve(self, repo_id: str, filename: str) -> None:
        repo = self._repo(repo_id)
        if repo is None or not self._access(repo):
            return
        f = repo.files.get(filename)
        if f is None:
            return self._error(404, "EntryNotFound", f"{filename} does not exist")
        common = {"X-Repo-Commit": repo.sha, "Accept-Ranges": "bytes"}
        if f.lfs:
            # Like the real Hub: LFS files redirect to a CDN; the HEAD answer carries the hash
            # and the size in X-Linked-* headers.
            self.send_response(302)
            self.send_header(
                "Location", f"{self.emulator.cdn_url}/cdn/{f.sha256}/{repo_id}/{quote(filename)}"
            )
            self.send_header("X-Linked-Etag", f'"{f.sha256}"')
            self.send_header("X-Linked-Size", str(f.size))
            self.send_header("ETag", f'"{f.sha256}"')
            for k, v in common.items():
                self.send_header(k, v)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._send_file(repo_id, f, {"ETag": f'"{f.git_sha1}"', **common})

    def _cdn(self, sha: str, rest: str) -> None:
        owner, name, filename = [*rest.split("/", 2), "", ""][:3]
        repo_id = f"{owner}/{name}"
        self._record(file=filename, cdn=True)
        repo = self.emulator.repos.get(repo_id)
        f = repo.files.get(filename) if repo else None
        if f is None or f.sha256 != sha:
            return self._error(404, "EntryNotFound", "no such blob")
        self._send_file(repo_id, f, {"ETag": f'"{sha}"'})

    def _send_file(self, repo_id: str, f: EmuFile, headers: dict[str, str]) -> None:
        emu = self.emulator
        size = f.size
        start, end = 0, size - 1
        rng = self.headers.get("Range")
        status = 200
        if rng:
            m = _RANGE_RE.fullmatch(rng.strip())
            if m:
                start = int(m[1])
                end = int(m[2]) if m[2] else size - 1
                if start >= size:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                end = min(end, size - 1)
                status = 206
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(end - start + 1))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        if self.command == "HEAD":
            return
        key = (repo_id, f.path)
        with emu.lock:
            drop = emu.drop_after.pop(key, None)
            hold = emu.hold_at.get(key)
            corrupt = key in emu.corrupt
        pos = start
        while pos <= end:
            n = min(CHUNK, end - pos + 1)
            if drop is not None:
                n = min(n, max(0, drop - (pos - start)))
                if n == 0:
                    return  # connection closed mid-file; Content-Length promised more
            if hold is not None and pos < hold:
                n = min(n, hold - pos)
            chunk = f.read(pos, n)
            if corrupt and pos <= size // 2 < pos + n:
                i = size // 2 - pos
                chunk = chunk[:i] + bytes([chunk[i] ^ 0xFF]) + chunk[i + 1 :]
            self.wfile.write(chunk)
            pos += n
            if hold is not None and pos == hold:
                self.wfile.flush()
                emu.held.set()
                emu.released.wait(30)


_SHA_CACHE: dict[tuple[str, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """SHA-256 of a file, computed once per test session (the real models are 100+ MB)."""
    st = path.stat()
    key = (str(path), st.st_size, int(st.st_mtime))
    if key not in _SHA_CACHE:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
        _SHA_CACHE[key] = h.hexdigest()
    return _SHA_CACHE[key]


def tiny_gguf(
    path: Path, name: str = "tiny", n_embd: int = 64, *, shard: int = 0, split_count: int = 0
) -> Path:
    """A small, coherent llama GGUF (every tensor a llama block needs, zeros), for tests that
    move files around and do not need to run them. With `split_count`, part `shard` of a
    split model of one block per part (part 0 also holds the embedding and output norm)."""
    import numpy as np
    from gguf import GGUFWriter

    path.parent.mkdir(parents=True, exist_ok=True)
    n_ff = n_embd * 2
    w = GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_block_count(max(split_count, 1))
    w.add_context_length(128)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(1)
    if split_count:
        w.add_uint16("split.no", shard)
        w.add_uint16("split.count", split_count)
    norm = np.ones(n_embd, dtype=np.float32)
    if shard == 0:
        w.add_tensor("token_embd.weight", np.zeros((32, n_embd), dtype=np.float16))
        w.add_tensor("output_norm.weight", norm)
    b = f"blk.{shard}"
    w.add_tensor(f"{b}.attn_q.weight", np.ones((n_embd, n_embd), dtype=np.float16))
    w.add_tensor(f"{b}.attn_norm.weight", norm)
    w.add_tensor(f"{b}.ffn_norm.weight", norm)
    for t in ("attn_k", "attn_v", "attn_output"):
        w.add_tensor(f"{b}.{t}.weight", np.zeros((n_embd, n_embd), dtype=np.float16))
    for t in ("ffn_gate", "ffn_up"):
        w.add_tensor(f"{b}.{t}.weight", np.zeros((n_ff, n_embd), dtype=np.float16))
    w.add_tensor(f"{b}.ffn_down.weight", np.zeros((n_embd, n_ff), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
