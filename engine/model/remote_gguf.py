"""Read a remote GGUF's header with HTTP Range requests, without downloading the file.

A GGUF keeps its metadata and tensor table at the start of the file, so the memory estimate
for a 40 GB model on the Hub costs a few MB of traffic (the vocabulary dominates). The byte
source plugs into `engine.model.gguf.parse_gguf`, whose reader fetches growing blocks (64 KiB up to
1 MiB) and skips long numeric arrays without reading them.
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from engine.model.gguf import GGUFError, GGUFFile, parse_gguf

HF_DEFAULT_ENDPOINT = "https://huggingface.co"
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


class RemoteGGUFError(GGUFError):
    """A remote file could not be read; `str()` is a one-line message."""


def hf_url(ref: str, *, endpoint: str | None = None, revision: str = "main") -> str:
    """`hf:owner/repo/path/file.gguf` -> the Hub's resolve URL (honours HF_ENDPOINT)."""
    spec = ref.removeprefix("hf:").strip("/")
    parts = spec.split("/")
    if len(parts) < 3 or not all(parts) or not parts[-1].lower().endswith(".gguf"):
        raise RemoteGGUFError(f"'{ref}' is not a Hub file reference; write hf:owner/repo/file.gguf")
    base = (endpoint or os.environ.get("HF_ENDPOINT") or HF_DEFAULT_ENDPOINT).rstrip("/")
    owner, repo, path = parts[0], parts[1], "/".join(parts[2:])
    return (
        f"{base}/{urllib.parse.quote(owner)}/{urllib.parse.quote(repo)}/resolve/"
        f"{urllib.parse.quote(revision)}/{urllib.parse.quote(path)}"
    )


def is_remote(ref: str) -> bool:
    return ref.startswith(("hf:", "http://", "https://"))


class HttpRangeSource:
    """A remote file as a `ByteSource`: each read is one Range request."""

    def __init__(
        self, url: str, *, timeout: float = 30.0, headers: dict[str, str] | None = None
    ) -> None:
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise RemoteGGUFError(f"only http and https URLs can be read, not {url!r}")
        self.url = url
        self.timeout = timeout
        self.headers = {"User-Agent": "candlewick", **(headers or {})}
        self.bytes_fetched = 0
        self.requests = 0
        self._size = self._probe()

    @property
    def size(self) -> int:
        return self._size

    @property
    def name(self) -> str:
        return urllib.parse.unquote(urllib.parse.urlsplit(self.url).path.rsplit("/", 1)[-1])

    def _get(self, start: int, end: int) -> tuple[int, str | None, bytes]:
        req = urllib.request.Request(
            self.url, headers={**self.headers, "Range": f"bytes={start}-{end}"}
        )
        self.requests += 1
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                status = int(resp.status)
                content_range = resp.headers.get("Content-Range")
                if status != 206:
                    # The server would send the whole file: stop before reading any of it.
                    return status, content_range, b""
                data = resp.read(end - start + 1)
        except urllib.error.HTTPError as e:
            if e.code == 416:
                raise RemoteGGUFError(
                    f"{self.name}: the server says the file is shorter than its header claims"
                ) from None
            if e.code in (401, 403):
                raise RemoteGGUFError(
                    f"{self.name}: access denied (HTTP {e.code}); the "
                    "repository may be gated or private"
                ) from None
            if e.code == 404:
                raise RemoteGGUFError(f"{self.name}: not found (HTTP 404) at {self.url}") from None
            raise RemoteGGUFError(f"{self.name}: the server answered HTTP {e.code}") from None
        except TimeoutError:
            raise RemoteGGUFError(
                f"{self.name}: the server did not answer within {self.timeout:g} s"
            ) from None
        except urllib.error.URLError as e:
            host = urllib.parse.urlsplit(self.url).netloc
            raise RemoteGGUFError(f"cannot reach {host}: {e.reason}") from None
        except OSError as e:
            raise RemoteGGUFError(f"{self.name}: the connection failed: {e}") from None
        self.bytes_fetched += len(data)
        return status, content_range, data

    def _probe(self) -> int:
        status, content_range, _ = self._get(0, 0)
        if status != 206:
            raise RemoteGGUFError(
                f"{self.name}: the server does not support range requests "
                "(needed to read only the header)"
            )
        m = _CONTENT_RANGE.match(content_range or "")
        if not m or m.group(3) == "*":
            raise RemoteGGUFError(f"{self.name}: the server did not say how large the file is")
        return int(m.group(3))

    def read_at(self, offset: int, length: int) -> bytes:
        if length <= 0 or offset >= self._size:
            return b""
        end = min(offset + length, self._size) - 1
        status, _, data = self._get(offset, end)
        if status != 206:
            raise RemoteGGUFError(f"{self.name}: the server stopped honouring range requests")
        return data


@dataclass(frozen=True)
class RemoteHeader:
    gguf: GGUFFile
    url: str
    file_bytes: int
    bytes_read: int
    requests: int


def read_remote_gguf(
    ref: str, *, endpoint: str | None = None, timeout: float = 30.0, check_architecture: bool = True
) -> RemoteHeader:
    """Parse the header of `hf:owner/repo/file.gguf` or an http(s) URL, reading only it."""
    from engine.model.gguf import merge_splits, split_count, split_names

    url = hf_url(ref, endpoint=endpoint) if ref.startswith("hf:") else ref
    src = HttpRangeSource(url, timeout=timeout)
    gf = parse_gguf(src, src.name, check_architecture=check_architecture)
    total, read, requests = src.size, src.bytes_fetched, src.requests
    names = split_names(src.name, split_count(gf))
    if names:
        # A split model: the other parts' headers hold the rest of the tensor table.
        base = url[: len(url) - len(urllib.parse.quote(src.name))]
        parts = [gf]
        for name in names[1:]:
            part = HttpRangeSource(base + urllib.parse.quote(name), timeout=timeout)
            parts.append(parse_gguf(part, name, check_architecture=False))
            total, read, requests = (
                total + part.size,
                read + part.bytes_fetched,
                requests + part.requests,
            )
        gf = merge_splits(parts)
    return RemoteHeader(gf, url, total, read, requests)
