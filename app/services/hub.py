"""Find GGUF models on the Hugging Face Hub (or any server speaking its API, e.g. `HF_ENDPOINT`).

Search, list a repository's GGUF files grouped by quantization (a sharded model
`name-00001-of-00003.gguf` … counts as one model), and read the model card's summary and
license. Every Hub failure becomes a `HubError` whose `str()` is one line a user can act on.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

import httpx2
from huggingface_hub import HfApi, ModelInfo, constants
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils._headers import build_hf_headers
from huggingface_hub.utils._http import hf_raise_for_status

log = logging.getLogger("candlewick.hub")

SortKey = Literal["downloads", "likes", "updated"]
_SORT_PARAM = {"downloads": "downloads", "likes": "likes", "updated": "lastModified"}

TokenProvider = Callable[[], str | None]
# (hub, repo_id, revision, variant) -> badge text such as "fits on GPU"; injected so listing
# stays fast and testable without the memory estimator (`header_fit` is the real one).
FitFunction = Callable[["HubClient", str, str, "ModelVariant"], str]
# (hub, repo_id, revision, variant) -> the predicted speed shown beside the fit badge
# (`header_speed` is the real one); injected like `fit`.
SpeedFunction = Callable[["HubClient", str, str, "ModelVariant"], "SpeedBadge"]
FIT_BADGES = {
    "fits_gpu": "fits on GPU",
    "partial_offload": "partial",
    "ram_only": "RAM only",
    "does_not_fit": "too big",
}


@dataclass(frozen=True)
class SpeedBadge:
    """A predicted decode speed for a Hub file: the badge text ("~45 tok/s") and what it is
    based on."""

    text: str
    tooltip: str
    tokens_per_s: float | None = None


class HubError(Exception):
    """Talking to the Hub failed; `str()` is a one-line message for the user."""


class HubOffline(HubError):
    pass


class HubAccessError(HubError):
    """401/403: a gated or private repository."""


class HubNotFound(HubError):
    pass


def hub_endpoint(explicit: str | None = None) -> str:
    """The Hub URL: explicit, else `HF_ENDPOINT` read now (not at import), else the default."""
    return (explicit or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def gated_message(repo_id: str, endpoint: str, *, had_token: bool) -> str:
    page = f"{endpoint}/{repo_id}"
    if had_token:
        return (
            f"{repo_id} is gated and your Hub token has no access to it yet: open {page}, "
            "accept the conditions with the same account, then try again"
        )
    return (
        f"{repo_id} is gated or private: open {page} and accept its conditions, then add a "
        "Hub access token (model manager settings, or the HF_TOKEN environment variable)"
    )


def translate_error(
    e: BaseException, repo_id: str, endpoint: str, *, had_token: bool, filename: str | None = None
) -> HubError:
    """Map huggingface_hub / httpx errors onto one-line HubErrors."""
    what = f"{repo_id}/{filename}" if filename else repo_id
    if isinstance(e, HubError):
        return e
    if isinstance(e, GatedRepoError):
        return HubAccessError(gated_message(repo_id, endpoint, had_token=had_token))
    if isinstance(e, RevisionNotFoundError):
        return HubNotFound(f"{what}: that revision does not exist on the Hub")
    if isinstance(e, RepositoryNotFoundError):
        status = e.response.status_code if e.response is not None else 404
        if status in (401, 403):
            return HubAccessError(gated_message(repo_id, endpoint, had_token=had_token))
        return HubNotFound(f"no repository called {repo_id} on the Hub ({endpoint})")
    if isinstance(e, HfHubHTTPError):
        status = e.response.status_code if e.response is not None else 0
        if status in (401, 403):
            return HubAccessError(gated_message(repo_id, endpoint, had_token=had_token))
        if status == 404:
            return HubNotFound(f"{what} was not found on the Hub")
        return HubError(f"the Hub answered HTTP {status} for {what}")
    if isinstance(e, OfflineModeIsEnabled):
        return HubOffline("offline mode is on (HF_HUB_OFFLINE): the Hub is not contacted")
    if isinstance(e, httpx2.TransportError | ConnectionError | TimeoutError):
        return HubOffline(f"the Hub ({endpoint}) cannot be reached: you appear to be offline")
    return HubError(f"unexpected answer from the Hub for {what}: {type(e).__name__}: {e}")


# The Hub's tag of speech recognition models (their pipeline), whisper.cpp's repositories too.
SPEECH_TAG = "automatic-speech-recognition"

# --- quantization names and shards -------------------------------------------------------------

_QUANT_RE = re.compile(
    r"(?<![A-Za-z0-9])("
    r"I?Q[1-8](?:_[0-9KSMLXN]+)*(?:_(?:XXS|XS|S|M|L|XL|NL))?"
    r"|TQ[12]_0|MXFP4(?:_MOE)?|BF16|F16|FP16|F32|FP32"
    r")(?![A-Za-z0-9])",
    re.IGNORECASE,
)
_SHARD_RE = re.compile(r"^(?P<base>.+)-(?P<idx>\d{5})-of-(?P<total>\d{5})\.gguf$", re.IGNORECASE)


def quantization_of(filename: str) -> str:
    """The quantization named in a GGUF file name (Q4_K_M, IQ2_XS, Q8_0, F16, …)."""
    stem = filename.rsplit("/", 1)[-1]
    matches = _QUANT_RE.findall(stem.replace(".gguf", "").replace(".GGUF", ""))
    if not matches:
        # Quantized repos often name the folder, not the file: "Q4_K_M/model-00001-of-2.gguf".
        matches = _QUANT_RE.findall(filename)
    if not matches:
        return "unknown"
    q = str(matches[-1]).upper()
    return {"FP16": "F16", "FP32": "F32"}.get(q, q)


def shard_info(filename: str) -> tuple[str, int, int] | None:
    """(base name, index, total) for `base-00001-of-00003.gguf`, else None."""
    m = _SHARD_RE.match(filename)
    if not m:
        return None
    return m["base"], int(m["idx"]), int(m["total"])


@dataclass(frozen=True)
class HubFile:
    filename: str  # path inside the repository
    size: int
    sha256: str | None  # LFS hash; None for small files stored in git
    blob_id: str | None = None  # git blob sha1 (verifies non-LFS files)

    def to_dict(self) -> dict[str, Any]:
        return {"filename": self.filename, "size_bytes": self.size, "sha256": self.sha256}


@dataclass(frozen=True)
class ModelVariant:
    """One downloadable model: a single GGUF file, or every shard of a split one."""

    name: str  # the file name, or `base.gguf` for a sharded model
    quantization: str
    files: tuple[HubFile, ...]
    shards_expected: int = 1
    kind: str = "model"  # model | projector (multimodal mmproj files) | speech (whisper.cpp)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def complete(self) -> bool:
        return len(self.files) == self.shards_expected

    @property
    def first_file(self) -> HubFile:
        return self.files[0]

    def to_dict(self, fit: str | None = None, speed: SpeedBadge | None = None) -> dict[str, Any]:
        return {
            "name": self.name,
            "file": self.first_file.filename,
            "quantization": self.quantization,
            "size_bytes": self.size,
            "shards": len(self.files),
            "complete": self.complete,
            "kind": self.kind,
            "fit": fit,
            "predicted_tokens_per_s": speed.tokens_per_s if speed is not None else None,
            "files": [f.to_dict() for f in self.files],
        }


def is_whisper_name(filename: str) -> bool:
    """whisper.cpp's model files as its repositories name them: `ggml-base.en-q5_1.bin` (not
    its test stubs `for-tests-ggml-*.bin`, nor the Silero VAD model `ggml-silero-*.bin`)."""
    name = filename.rsplit("/", 1)[-1].lower()
    return name.startswith("ggml-") and name.endswith(".bin") and "silero" not in name


def group_variants(files: Iterable[HubFile]) -> list[ModelVariant]:
    """GGUF files grouped into models: shards of one model become one variant. whisper.cpp's
    ggml files are speech variants, named by their quantization like GGUF quants (a file
    without one is whisper.cpp's f16)."""
    singles: list[ModelVariant] = []
    shards: dict[tuple[str, int], list[tuple[int, HubFile]]] = {}
    for f in files:
        if is_whisper_name(f.filename):
            quant = quantization_of(f.filename.removesuffix(".bin"))
            quant = "F16" if quant == "unknown" else quant
            singles.append(ModelVariant(f.filename, quant, (f,), 1, "speech"))
            continue
        if not f.filename.lower().endswith(".gguf"):
            continue
        kind = "projector" if "mmproj" in f.filename.rsplit("/", 1)[-1].lower() else "model"
        info = shard_info(f.filename)
        if info is None:
            singles.append(ModelVariant(f.filename, quantization_of(f.filename), (f,), 1, kind))
        else:
            base, idx, total = info
            shards.setdefault((base, total), []).append((idx, f))
    for (base, total), parts in shards.items():
        parts.sort(key=lambda p: p[0])
        name = f"{base}.gguf"
        kind = "projector" if "mmproj" in name.lower() else "model"
        singles.append(
            ModelVariant(name, quantization_of(name), tuple(p[1] for p in parts), total, kind)
        )
    singles.sort(key=lambda v: (v.kind != "model", v.size, v.name))
    return singles


# --- search and repository details -------------------------------------------------------------


@dataclass(frozen=True)
class RepoSummary:
    repo_id: str
    downloads: int
    likes: int
    last_modified: str | None  # ISO 8601
    gated: bool
    tags: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "repo": self.repo_id,
            "downloads": self.downloads,
            "likes": self.likes,
            "last_modified": self.last_modified,
            "gated": self.gated,
        }


@dataclass
class RepoDetails:
    repo_id: str
    commit: str | None
    variants: list[ModelVariant]
    summary: str
    license: str | None
    gated: bool
    fits: dict[str, str] = field(default_factory=dict)  # variant name -> fit badge
    speeds: dict[str, SpeedBadge] = field(default_factory=dict)  # variant name -> speed

    def variant(self, name_or_file: str) -> ModelVariant | None:
        """Find a variant by its name, its first file, or any of its shard files."""
        for v in self.variants:
            if name_or_file == v.name or any(name_or_file == f.filename for f in v.files):
                return v
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "repo": self.repo_id,
            "commit": self.commit,
            "license": self.license,
            "gated": self.gated,
            "summary": self.summary,
            "files": [
                v.to_dict(self.fits.get(v.name), self.speeds.get(v.name)) for v in self.variants
            ],
        }


def card_summary(readme: str, limit: int = 400) -> str:
    """The first prose paragraph of a model card (front matter, headings, tables, images and
    HTML skipped), shortened to `limit` characters."""
    text = readme
    if text.startswith("---"):
        end = text.find("\n---", 3)
        text = text[end + 4 :] if end != -1 else ""
    paragraph: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        skip = not line or line.startswith(("#", "|", "!", "<", ">", "```", "[!", "-" * 3))
        if skip:
            if paragraph:
                break
            continue
        paragraph.append(line)
    out = " ".join(paragraph)
    out = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", out)  # links -> their text
    out = re.sub(r"[*_`]{1,3}", "", out)
    return out if len(out) <= limit else out[: limit - 1].rstrip() + "…"


def card_license(readme: str) -> str | None:
    m = re.search(r"^license:\s*['\"]?([^'\"\n]+)", readme.split("\n---", 1)[0], re.MULTILINE)
    return m[1].strip() if m and readme.startswith("---") else None


class HubClient:
    """Search and inspect GGUF repositories. `token` is a callable so a token saved later in the
    session (secrets.TokenStore.get) is used without rebuilding the client."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        token: TokenProvider | None = None,
        fit: FitFunction | None = None,
        speed: SpeedFunction | None = None,
        timeout: float = 15.0,
    ) -> None:
        self._endpoint = endpoint
        self._token = token or (lambda: None)
        self.fit = fit
        self.speed = speed
        self.timeout = timeout
        # Parsed headers of Hub files: the fit and the speed read each one once.
        self._headers: dict[tuple[str, str, str], Any] = {}
        self._headers_lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return hub_endpoint(self._endpoint)

    def check_online(self) -> None:
        """Honour HF_HUB_OFFLINE (read now): the Hub is not contacted at all."""
        if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
            raise HubOffline("offline mode is on (HF_HUB_OFFLINE): the Hub is not contacted")

    def _api(self) -> tuple[HfApi, str | None]:
        token = self._token()
        # token=False stops huggingface_hub from reading a token file behind our back when the
        # user has none: what we send is exactly what the user configured (or HF_TOKEN).
        return HfApi(
            endpoint=self.endpoint,
            token=token or os.environ.get("HF_TOKEN") or False,
            library_name="candlewick",
        ), token

    def search(
        self, query: str, *, sort: SortKey = "downloads", limit: int = 30, speech: bool = False
    ) -> list[RepoSummary]:
        """GGUF repositories matching `query` (`speech`: speech-recognition ones, where
        whisper.cpp's files are). One request, no retry loop: huggingface_hub's
        `list_models` retries a dead connection for ~25 s, far too long to learn we are
        offline; the answer is parsed with its own ModelInfo."""
        self.check_online()
        token = self._token()
        kind = SPEECH_TAG if speech else "gguf"
        params: dict[str, Any] = {"filter": kind, "sort": _SORT_PARAM[sort], "limit": limit}
        if query:
            params["search"] = query
        try:
            r = httpx2.get(
                f"{self.endpoint}/api/models",
                params=params,
                headers=self.headers(),
                timeout=self.timeout,
                follow_redirects=True,
            )
            hf_raise_for_status(r)
            found = [ModelInfo(**item) for item in r.json()]  # type: ignore[no-untyped-call]
        except Exception as e:
            raise translate_error(
                e, query or "search", self.endpoint, had_token=bool(token)
            ) from None
        out = []
        for m in found[:limit]:
            out.append(
                RepoSummary(
                    repo_id=m.id,
                    downloads=int(m.downloads or 0),
                    likes=int(m.likes or 0),
                    last_modified=m.last_modified.isoformat() if m.last_modified else None,
                    gated=bool(m.gated),
                    tags=tuple(m.tags or ()),
                )
            )
        return out

    def repo_details(
        self, repo_id: str, *, revision: str = "main", with_fit: bool = True
    ) -> RepoDetails:
        self.check_online()
        api, token = self._api()
        try:
            info = api.model_info(
                repo_id, revision=revision, files_metadata=True, timeout=self.timeout
            )
        except Exception as e:
            raise translate_error(e, repo_id, self.endpoint, had_token=bool(token)) from None
        files = []
        for s in info.siblings or []:
            size = s.lfs.size if s.lfs else (s.size or 0)
            files.append(
                HubFile(s.rfilename, int(size), s.lfs.sha256 if s.lfs else None, s.blob_id)
            )
        card: dict[str, Any] = dict(info.card_data.to_dict()) if info.card_data else {}  # type: ignore[no-untyped-call]
        readme = (
            self._readme(repo_id, info.sha or revision, token)
            if any(f.filename == "README.md" for f in files)
            else ""
        )
        license_ = (
            card.get("license")
            or card_license(readme)
            or next(
                (t.split(":", 1)[1] for t in (info.tags or []) if t.startswith("license:")), None
            )
        )
        details = RepoDetails(
            repo_id=info.id or repo_id,
            commit=info.sha,
            variants=group_variants(files),
            summary=card_summary(readme),
            license=str(license_) if license_ else None,
            gated=bool(info.gated),
        )
        if with_fit and self.fit is not None:
            for v in details.variants:
                if v.kind == "model":
                    details.fits[v.name] = self.fit_badge(
                        details.repo_id, v, details.commit or revision
                    )
        if with_fit and self.speed is not None:
            for v in details.variants:
                badge = (
                    self.speed_badge(details.repo_id, v, details.commit or revision)
                    if v.kind == "model"
                    else None
                )
                if badge is not None:
                    details.speeds[v.name] = badge
        return details

    def fit_badge(self, repo_id: str, variant: ModelVariant, revision: str = "main") -> str:
        if self.fit is None:
            return "unknown"
        try:
            return self.fit(self, repo_id, revision, variant)
        except HubAccessError:
            return "unknown (needs access)"
        except Exception as e:  # a badge must never break the file list
            log.debug("fit estimate for %s/%s failed: %s", repo_id, variant.name, e)
            return "unknown"

    def speed_badge(
        self, repo_id: str, variant: ModelVariant, revision: str = "main"
    ) -> SpeedBadge | None:
        """The predicted speed of a model file on this machine, or None when it cannot be
        told (no predictor, the header unreadable, no access)."""
        if self.speed is None:
            return None
        try:
            return self.speed(self, repo_id, revision, variant)
        except Exception as e:  # a badge must never break the file list
            log.debug("speed prediction for %s/%s failed: %s", repo_id, variant.name, e)
            return None

    def header(self, repo_id: str, revision: str, variant: ModelVariant) -> Any:
        """The parsed GGUF header of a Hub model (`remote_gguf`), read once per file."""
        key = (repo_id, revision, variant.name)
        with self._headers_lock:
            found = self._headers.get(key)
        if found is None:
            found = remote_gguf(self, repo_id, revision, variant)
            with self._headers_lock:
                if len(self._headers) >= 64:  # a session's browsing, not every repository
                    self._headers.pop(next(iter(self._headers)))
                self._headers[key] = found
        return found

    def speech_fit(self, repo_id: str, revision: str, variant: ModelVariant) -> str:
        """What a speech (whisper.cpp) file on the Hub will take in memory, from its first bytes
        (one Range request): "needs 316 MB"; "unknown" when they cannot be read."""
        from engine.errors import EngineError
        from engine.memory.whisper import memory_of
        from engine.model.gguf import human_bytes
        from engine.model.whisper_file import HEADER_BYTES, parse_hparams

        f = variant.first_file
        try:
            with httpx2.Client(follow_redirects=True, timeout=self.timeout) as client:
                url = self.file_url(repo_id, f.filename, revision)
                src = RangeSource(client, url, self.headers(), f.size, block=HEADER_BYTES)
                hp = parse_hparams(src.read_at(0, HEADER_BYTES), f.filename)
        except (HubError, EngineError, httpx2.HTTPError) as e:
            log.debug("speech file header %s/%s: %s", repo_id, f.filename, e)
            return "unknown"
        return f"needs {human_bytes(memory_of(hp, f.size).total)}"

    def file_url(self, repo_id: str, filename: str, revision: str = "main") -> str:
        return f"{self.endpoint}/{repo_id}/resolve/{quote(revision, safe='')}/{quote(filename)}"

    def headers(self) -> dict[str, str]:
        token = self._token() or os.environ.get("HF_TOKEN")
        return dict(build_hf_headers(token=token or False, library_name="candlewick"))

    def _readme(self, repo_id: str, revision: str, token: str | None) -> str:
        try:
            r = httpx2.get(
                self.file_url(repo_id, "README.md", revision),
                headers=self.headers(),
                timeout=self.timeout,
                follow_redirects=True,
            )
        except httpx2.HTTPError:
            return ""
        if r.status_code != 200:
            return ""
        return r.text[:200_000]


# --- the fit badge: a memory estimate from the GGUF header, read with HTTP Range --------------


class RangeSource:
    """A remote file as an engine.model.gguf ByteSource: reads whole blocks with Range requests and
    keeps them, so parsing a header costs a few requests, never the file.

    Not engine.model.remote_gguf.HttpRangeSource: this one sends the user's Hub token, and httpx
    drops it when the Hub redirects to its CDN (another origin) where urllib would forward it."""

    def __init__(
        self,
        client: httpx2.Client,
        url: str,
        headers: dict[str, str],
        size: int,
        block: int = 1 << 20,
        max_bytes: int = 64 << 20,
    ) -> None:
        self._client, self._url, self._headers = client, url, headers
        self._size, self._block, self._budget = size, block, max_bytes
        self._blocks: dict[int, bytes] = {}

    @property
    def size(self) -> int:
        return self._size

    def _get(self, index: int) -> bytes:
        cached = self._blocks.get(index)
        if cached is None:
            start = index * self._block
            end = min(start + self._block, self._size) - 1
            if (len(self._blocks) + 1) * self._block > self._budget:
                raise HubError("the GGUF header is too large to read over the network")
            r = self._client.get(
                self._url, headers={**self._headers, "Range": f"bytes={start}-{end}"}
            )
            if r.status_code in (401, 403):
                raise HubAccessError("the file needs access to the repository")
            if r.status_code not in (200, 206):
                raise HubError(f"HTTP {r.status_code} while reading the GGUF header")
            data = r.content
            cached = data[start : end + 1] if r.status_code == 200 else data
            self._blocks[index] = cached
        return cached

    def read_at(self, offset: int, length: int) -> bytes:
        out = bytearray()
        end = min(offset + length, self._size)
        pos = offset
        while pos < end:
            i = pos // self._block
            block = self._get(i)
            lo = pos - i * self._block
            take = block[lo : lo + (end - pos)]
            if not take:
                break
            out += take
            pos += len(take)
        return bytes(out)


def remote_gguf(hub: HubClient, repo_id: str, revision: str, variant: ModelVariant) -> Any:
    """The parsed GGUF header of a model on the Hub (engine.model.gguf.GGUFFile), read with Range
    requests. For a split model every shard's tensor table is read and merged."""
    from engine.model.gguf import merge_splits, parse_gguf

    headers = hub.headers()
    parts = []
    with httpx2.Client(follow_redirects=True, timeout=hub.timeout) as client:
        for i, f in enumerate(variant.files):
            src = RangeSource(client, hub.file_url(repo_id, f.filename, revision), headers, f.size)
            # Only the first shard of a split model carries the architecture.
            parts.append(parse_gguf(src, f.filename, check_architecture=i == 0))
    return merge_splits(parts) if len(parts) > 1 else parts[0]


def header_fit(hardware: Any = None, params: Any = None) -> FitFunction:
    """A FitFunction using engine.memory's analytic estimate on the header read over HTTP.
    `hardware`/`params` default to this machine and the default load settings."""
    from engine.memory.estimate import estimate
    from engine.memory.params import EstimateParams

    state: dict[str, Any] = {"hw": hardware}

    def fit(hub: HubClient, repo_id: str, revision: str, variant: ModelVariant) -> str:
        if state["hw"] is None:
            from engine.memory.hardware import detect

            state["hw"] = detect()
        gf = hub.header(repo_id, revision, variant)
        est = estimate(gf, params or EstimateParams(), hardware=state["hw"], method="analytic")
        return FIT_BADGES.get(est.verdict, est.verdict)

    return fit


def header_speed(service: Any) -> SpeedFunction:
    """A SpeedFunction: `app.services.speed_records.SpeedService`'s prediction from the header
    read over HTTP, with the speed measured on the downloaded file beside it once known."""
    from app.services.speed_records import file_key

    def speed(hub: HubClient, repo_id: str, revision: str, variant: ModelVariant) -> SpeedBadge:
        key = file_key(variant.name, variant.size)
        prediction = service.predict_header(hub.header(repo_id, revision, variant), key)
        view = service.records.view(key, prediction)
        return SpeedBadge(view.text(), view.tooltip(), prediction.tokens_per_s)

    return speed


def default_fit() -> FitFunction | None:
    """The header-only fit estimate, or None if the estimator cannot be imported."""
    try:
        return header_fit()
    except ImportError:
        return None
