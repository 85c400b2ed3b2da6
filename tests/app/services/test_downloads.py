"""Verified, resumable downloads against the local Hub emulator with injected faults."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import hf_hub_download, try_to_load_from_cache

from app.services.download_jobs import DONE, FAILED, PAUSED, DownloadJob
from app.services.download_manager import DownloadManager
from app.services.hf_cache import repo_folder
from app.services.hub import HubClient
from app.services.library import ModelLibrary
from engine.model.facts import model_facts
from engine.model.gguf import human_bytes, read_gguf
from tests.hub_emulator import HubEmulator, file_sha256, running_hub

REPO = "bartowski/SmolLM2-135M-Instruct-GGUF"
FILE = "SmolLM2-135M-Instruct-Q4_1.gguf"
KEY = (REPO, FILE)


@pytest.fixture
def hub(smollm2_path: Path) -> Iterator[HubEmulator]:
    with running_hub() as emu:
        r = emu.repo(REPO)
        r.add(FILE, source=smollm2_path)
        r.add("small-Q8_0.gguf", data=b"GGUF" + bytes(range(256)) * 40)
        r.add("big-00001-of-00002.gguf", data=b"1" * 3000)
        r.add("big-00002-of-00002.gguf", data=b"2" * 2000)
        yield emu


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return tmp_path / "hf" / "hub"


def manager(hub: HubEmulator, state: Path, **kw: object) -> DownloadManager:
    return DownloadManager(state, HubClient(hub.url), **kw)  # type: ignore[arg-type]


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())


def test_download_is_verified_into_the_standard_hf_cache(
    hub: HubEmulator, cache: Path, tmp_path: Path, smollm2_path: Path
) -> None:
    dm = manager(hub, tmp_path / "downloads.json")
    try:
        job = dm.wait(dm.add(REPO, FILE).id, 120)
    finally:
        dm.close()
    assert job is not None and job.status == DONE, job
    path = Path(job.path or "")
    assert path.is_symlink()  # snapshots/<commit>/file -> ../../blobs/<sha256>
    assert path.resolve().name == file_sha256(smollm2_path)
    assert file_sha256(path) == file_sha256(smollm2_path)
    assert model_facts(read_gguf(path)).quantization == "Q4_1"
    # huggingface_hub itself sees the file as cached: other tools share it.
    commit = hub.repos[REPO].sha
    assert try_to_load_from_cache(REPO, FILE, cache_dir=cache) == str(path)
    assert (repo_folder(cache, REPO) / "refs" / "main").read_text() == commit
    assert hf_hub_download(REPO, FILE, cache_dir=cache, local_files_only=True) == str(path)
    assert not list(cache.rglob("*.incomplete"))


def test_dropped_connection_resumes_from_the_last_byte(
    hub: HubEmulator, cache: Path, tmp_path: Path, smollm2_path: Path
) -> None:
    hub.drop_after[KEY] = 30_000_000
    dm = manager(hub, tmp_path / "downloads.json", retry_delay=0.05)
    try:
        job = dm.wait(dm.add(REPO, FILE).id, 120)
    finally:
        dm.close()
    assert job is not None and job.status == DONE, job
    gets = [r for r in hub.file_requests(FILE) if r.get("cdn")]
    assert len(gets) == 2
    assert gets[0]["range"] is None
    resumed_from = int(gets[1]["range"][len("bytes=") : -1])
    # Resumed near the drop (at most one read chunk was lost), not from zero.
    assert 29_000_000 <= resumed_from <= 30_000_000
    assert file_sha256(Path(job.path or "")) == file_sha256(smollm2_path)


def test_download_survives_an_app_restart(
    hub: HubEmulator, cache: Path, tmp_path: Path, smollm2_path: Path
) -> None:
    state = tmp_path / "downloads.json"
    hub.hold_at[KEY] = 20_000_000  # the transfer stalls mid-file
    dm = manager(hub, state)
    job = dm.add(REPO, FILE)
    assert hub.held.wait(60)
    dm.pause(job.id)
    hub.released.set()
    paused = dm.wait(job.id, 60)
    dm.close()  # the app closes
    assert paused is not None and paused.status == PAUSED
    partial = list(cache.rglob("*.incomplete"))
    assert len(partial) == 1 and partial[0].stat().st_size == paused.done_bytes > 0
    saved = json.loads(state.read_text())["jobs"]
    assert saved[0]["status"] == PAUSED

    del hub.hold_at[KEY]
    dm2 = manager(hub, state)  # the app starts again
    try:
        again = dm2.get(job.id)
        assert again is not None and again.status == PAUSED
        assert again.done_bytes == paused.done_bytes
        dm2.resume(job.id)
        done = dm2.wait(job.id, 120)
    finally:
        dm2.close()
    assert done is not None and done.status == DONE, done
    last = [r for r in hub.file_requests(FILE) if r.get("cdn")][-1]
    assert last["range"] == f"bytes={paused.done_bytes}-"
    assert file_sha256(Path(done.path or "")) == file_sha256(smollm2_path)


def test_interrupted_by_closing_is_paused_and_resumable(
    hub: HubEmulator, cache: Path, tmp_path: Path
) -> None:
    state = tmp_path / "downloads.json"
    hub.hold_at[KEY] = 10_000_000  # the connection stalls; a read timeout notices the close
    dm = manager(hub, state, read_timeout=0.5)
    job = dm.add(REPO, FILE)
    assert hub.held.wait(60)
    dm.close()  # closed while downloading: nothing lost, the job waits to be resumed
    hub.released.set()
    dm2 = manager(hub, state)
    try:
        j = dm2.get(job.id)
        assert j is not None and j.status == PAUSED
        assert j.note == "interrupted when the app closed"
        partial = list(cache.rglob("*.incomplete"))
        assert len(partial) == 1 and 0 < j.done_bytes == partial[0].stat().st_size
        del hub.hold_at[KEY]
        dm2.resume_all()
        j = dm2.wait(job.id, 120)
        assert j is not None and j.status == DONE
    finally:
        dm2.close()


def test_corrupt_bytes_are_refused_and_never_listed(
    hub: HubEmulator, cache: Path, tmp_path: Path
) -> None:
    hub.corrupt.add(KEY)
    models = tmp_path / "models"
    dm = manager(hub, models / "downloads.json")
    try:
        job = dm.wait(dm.add(REPO, FILE).id, 120)
    finally:
        dm.close()
    assert job is not None and job.status == FAILED
    assert job.error is not None and "corrupt" in job.error and "SHA-256" in job.error
    assert "\n" not in job.error
    assert job.path is None
    assert not [f for f in files_under(cache) if "blobs/" in f or "snapshots/" in f]
    lib = ModelLibrary(models, bundled=False)
    assert [e for e in lib.entries() if e.source == "downloaded"] == []
    assert all(e.path.name != FILE for e in lib.entries())


def test_cancel_leaves_nothing_behind(hub: HubEmulator, cache: Path, tmp_path: Path) -> None:
    state = tmp_path / "downloads.json"
    hub.hold_at[KEY] = 5_000_000
    dm = manager(hub, state)
    try:
        job = dm.add(REPO, FILE)
        assert hub.held.wait(60)
        assert list(cache.rglob("*.incomplete"))
        dm.cancel(job.id)
        hub.released.set()
        assert dm.wait(job.id, 60) is None  # gone from the list
    finally:
        dm.close()
    assert files_under(cache) == []
    assert not repo_folder(cache, REPO).exists()
    assert json.loads(state.read_text())["jobs"] == []


def test_cancel_a_paused_download_deletes_its_bytes(
    hub: HubEmulator, cache: Path, tmp_path: Path
) -> None:
    hub.hold_at[KEY] = 5_000_000
    dm = manager(hub, tmp_path / "downloads.json")
    try:
        job = dm.add(REPO, FILE)
        assert hub.held.wait(60)
        dm.pause(job.id)
        hub.released.set()
        assert (dm.wait(job.id, 60) or DownloadJob("", "")).status == PAUSED
        dm.cancel(job.id)
        assert dm.get(job.id) is None
    finally:
        dm.close()
    assert files_under(cache) == []


def test_full_disk_is_refused_before_starting(
    hub: HubEmulator, cache: Path, tmp_path: Path
) -> None:
    dm = manager(hub, tmp_path / "downloads.json", free_space=lambda p: 50 * 1024 * 1024)
    try:
        job = dm.wait(dm.add(REPO, FILE).id, 60)
    finally:
        dm.close()
    assert job is not None and job.status == FAILED
    assert job.error is not None and "not enough disk space" in job.error
    assert (
        f"needs {human_bytes(job.size or 0)} more, {human_bytes(50 * 1024 * 1024)} free"
        in job.error
    )
    assert hub.file_requests(FILE) == []  # not a byte requested
    assert not list(cache.rglob("*.incomplete"))


def test_missing_file_and_repo_are_clear(hub: HubEmulator, cache: Path, tmp_path: Path) -> None:
    dm = manager(hub, tmp_path / "downloads.json")
    try:
        a = dm.wait(dm.add(REPO, "nope-Q4_0.gguf").id, 60)
        b = dm.wait(dm.add("nobody/nothing", "x.gguf").id, 60)
    finally:
        dm.close()
    assert (
        a is not None
        and a.status == FAILED
        and "nope-Q4_0.gguf is not a GGUF file" in (a.error or "")
    )
    assert (
        b is not None
        and b.status == FAILED
        and "no repository called nobody/nothing" in (b.error or "")
    )


def test_queue_runs_downloads_in_turn(hub: HubEmulator, cache: Path, tmp_path: Path) -> None:
    dm = manager(hub, tmp_path / "downloads.json", max_parallel=1)
    try:
        jobs = [
            dm.add(REPO, f)
            for f in ("small-Q8_0.gguf", "big-00001-of-00002.gguf", "big-00002-of-00002.gguf")
        ]
        results = [dm.wait(j.id, 60) for j in jobs]
    finally:
        dm.close()
    assert [r.status if r else None for r in results] == [DONE, DONE, DONE]
    order = [r["file"] for r in hub.requests if r.get("cdn")]
    assert order == ["small-Q8_0.gguf", "big-00001-of-00002.gguf", "big-00002-of-00002.gguf"]


def test_gated_repo_needs_a_token_and_the_token_is_never_written(
    smollm2_path: Path,
    cache: Path,
    tmp_path: Path,
    candlewick_home: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = "hf_SeCrEtToKeN1234567890"
    caplog.set_level(logging.DEBUG)
    token: dict[str, str | None] = {"value": None}
    with running_hub() as emu:
        emu.repo("google/gated", gated=True, granted_tokens={secret}).add(
            "g-Q4_1.gguf", source=smollm2_path
        )
        dm = DownloadManager(
            candlewick_home / "data" / "downloads.json",
            HubClient(emu.url, token=lambda: token["value"]),
        )
        try:
            denied = dm.wait(dm.add("google/gated", "g-Q4_1.gguf").id, 60)
            assert denied is not None and denied.status == FAILED
            assert "gated" in (denied.error or "") and f"{emu.url}/google/gated" in (
                denied.error or ""
            )
            assert "accept" in (denied.error or "")
            token["value"] = "hf_wrong"
            dm.resume(denied.id)
            wrong = dm.wait(denied.id, 60)
            assert wrong is not None and "has no access" in (wrong.error or "")
            token["value"] = secret
            dm.resume(denied.id)
            ok = dm.wait(denied.id, 120)
            assert ok is not None and ok.status == DONE, ok
        finally:
            dm.close()
        assert any(r["auth"] for r in emu.requests if not r.get("cdn"))
        # The token goes to the Hub only, never to the CDN origin it redirects to.
        assert [r for r in emu.requests if r.get("cdn")]
        assert not any(r["auth"] for r in emu.requests if r.get("cdn"))
    for root in (candlewick_home, cache.parent):
        for f in root.rglob("*"):
            if f.is_file() and not f.is_symlink() and f.stat().st_size < 50_000_000:
                assert secret.encode() not in f.read_bytes(), f
    assert secret not in caplog.text


def test_huggingface_hub_alone_accepts_corrupt_bytes(
    hub: HubEmulator, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why Candlewick verifies: huggingface_hub stores bytes that differ from the LFS hash
    without a word, against the same emulator."""
    import tqdm

    monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 0)  # no monitor thread left behind
    hub.corrupt.add(KEY)
    path = Path(hf_hub_download(REPO, FILE, cache_dir=tmp_path / "plain", endpoint=hub.url))
    expected = hub.repos[REPO].files[FILE].sha256
    assert path.resolve().name == expected  # filed under the advertised hash...
    assert file_sha256(path) != expected  # ...but the bytes are not those


def test_blob_already_in_the_cache_is_checked_not_trusted(
    hub: HubEmulator,
    cache: Path,
    tmp_path: Path,
    smollm2_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import tqdm

    monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 0)
    hub.corrupt.add(KEY)
    hf_hub_download(REPO, FILE, cache_dir=cache, endpoint=hub.url)  # another tool, bad bytes
    hub.corrupt.clear()
    fetched = len(hub.file_requests(FILE))
    dm = manager(hub, tmp_path / "downloads.json")
    try:
        job = dm.wait(dm.add(REPO, FILE).id, 120)
        assert job is not None and job.status == DONE
        assert job.note == "replaced a corrupt copy found in the Hugging Face cache"
        assert file_sha256(Path(job.path or "")) == file_sha256(smollm2_path)
        assert len(hub.file_requests(FILE)) > fetched  # fetched again
        # A good copy already there is verified and used as it is: no bytes fetched.
        dm.remove(job.id)
        fetched = len(hub.file_requests(FILE))
        again = dm.wait(dm.add(REPO, FILE).id, 120)
        assert again is not None and again.status == DONE and again.note is None
        assert len(hub.file_requests(FILE)) == fetched
    finally:
        dm.close()


def test_space_taken_by_running_downloads_counts(
    hub: HubEmulator, cache: Path, tmp_path: Path, smollm2_path: Path
) -> None:
    size = smollm2_path.stat().st_size
    hub.repos[REPO].add("copy-Q4_1.gguf", source=smollm2_path)
    hub.hold_at[KEY] = 1_000_000
    # Room for one model (plus the safety margin), not for two.
    dm = manager(
        hub,
        tmp_path / "downloads.json",
        max_parallel=2,
        free_space=lambda p: size + 100 * 1024 * 1024,
    )
    try:
        first = dm.add(REPO, FILE)
        assert hub.held.wait(60)
        second = dm.wait(dm.add(REPO, "copy-Q4_1.gguf").id, 60)
        assert second is not None and second.status == FAILED
        assert "not enough disk space" in (second.error or "")
        hub.released.set()
        done = dm.wait(first.id, 120)
        assert done is not None and done.status == DONE
    finally:
        hub.released.set()
        dm.close()
