"""The `candlewick models` contract against the local Hub emulator, through a real process:
HF_ENDPOINT and HF_HOME reach it the way they reach a user's shell."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.model.gguf import human_bytes
from tests.app.cli_inproc import run_cli
from tests.hub_emulator import HubEmulator, file_sha256, running_hub, tiny_gguf

REPO = "bartowski/SmolLM2-135M-Instruct-GGUF"
FILE = "SmolLM2-135M-Instruct-Q4_1.gguf"


@pytest.fixture
def hub(
    smollm2_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[HubEmulator]:
    with running_hub() as emu:
        r = emu.repo(REPO, downloads=1000, likes=5)
        r.add(FILE, source=smollm2_path)
        r.add("SmolLM2-135M-Instruct-Q8_0-00001-of-00002.gguf", data=b"x" * 700)
        r.add("SmolLM2-135M-Instruct-Q8_0-00002-of-00002.gguf", data=b"y" * 300)
        r.add("README.md", data=b"---\nlicense: apache-2.0\n---\nA tiny chat model.\n", lfs=False)
        emu.repo("other/corrupt-GGUF").add("c-Q4_1.gguf", source=smollm2_path)
        emu.corrupt.add(("other/corrupt-GGUF", "c-Q4_1.gguf"))
        emu.repo("google/gated-GGUF", gated=True).add("g-Q4_1.gguf", data=b"g" * 10)
        monkeypatch.setenv("HF_ENDPOINT", emu.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        yield emu


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli("models", *args, stdin=stdin)


def one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, (r.stdout, r.stderr)
    # Progress lines may come first; the error itself is one line, and the last one.
    lines = [ln for ln in r.stderr.strip().splitlines() if not ln.startswith("downloading:")]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("candlewick: error: ")
    return lines[0]


def test_search_json_and_table(hub: HubEmulator) -> None:
    r = cli("search", "smollm2", "--json")
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout)
    assert [f["repo"] for f in found] == [REPO]
    assert found[0]["downloads"] == 1000 and found[0]["likes"] == 5
    table = cli("search", "smollm2")
    assert table.returncode == 0 and REPO in table.stdout and "DOWNLOADS" in table.stdout


def test_files_json_has_name_quant_size_fit(hub: HubEmulator, smollm2_path: Path) -> None:
    r = cli("files", REPO, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["license"] == "apache-2.0" and out["summary"] == "A tiny chat model."
    by_file = {f["file"]: f for f in out["files"]}
    q4 = by_file[FILE]
    assert q4["quantization"] == "Q4_1"
    assert q4["size_bytes"] == smollm2_path.stat().st_size
    # This machine has no GPU: a 98 MB model runs from RAM.
    assert q4["fit"] == "RAM only"
    # The decode speed predicted on this machine from the same header (its figures measured
    # by the probe into this test's data folder); a projector or a broken file has none.
    assert q4["predicted_tokens_per_s"] > 0
    q8 = by_file["SmolLM2-135M-Instruct-Q8_0-00001-of-00002.gguf"]
    assert q8["name"] == "SmolLM2-135M-Instruct-Q8_0.gguf" and q8["shards"] == 2
    assert q8["size_bytes"] == 1000 and q8["quantization"] == "Q8_0"
    table = cli("files", REPO, "--no-fit")
    assert (
        table.returncode == 0 and "Q4_1" in table.stdout and str(q4["size_bytes"]) in table.stdout
    )
    assert "SPEED" in table.stdout and "tok/s" not in table.stdout  # not predicted: skipped


def test_download_then_list_then_delete(
    hub: HubEmulator, tmp_path: Path, smollm2_path: Path
) -> None:
    r = cli("download", REPO, FILE)
    assert r.returncode == 0, r.stderr
    assert "downloading:" in r.stderr and "Downloaded and verified" in r.stderr
    model_id = r.stdout.strip()
    listed = json.loads(cli("list", "--json").stdout)
    entry = next(m for m in listed if m["id"] == model_id)
    assert entry["source"] == "downloaded" and entry["label"] == f"{REPO}/{FILE}"
    assert entry["quantization"] == "Q4_1"
    path = Path(entry["path"])
    assert str(path).startswith(str(tmp_path / "hf" / "hub"))
    assert file_sha256(path) == file_sha256(smollm2_path)
    again = cli("download", REPO, FILE)  # already there: verified once, not fetched again
    assert again.returncode == 0 and again.stdout.strip() == model_id
    assert len([r for r in hub.file_requests(FILE) if r.get("cdn")]) == 1

    no = cli("delete", model_id)  # not a terminal and no --yes: refuses, deletes nothing
    assert "add --yes" in one_line_error(no) and path.exists()
    gone = cli("delete", model_id, "--yes")
    assert gone.returncode == 0, gone.stderr
    assert f"freed {human_bytes(smollm2_path.stat().st_size)}" in gone.stdout
    assert not path.exists()
    assert not (tmp_path / "hf" / "hub" / "models--bartowski--SmolLM2-135M-Instruct-GGUF").exists()
    assert model_id not in {m["id"] for m in json.loads(cli("list", "--json").stdout)}


def test_download_sharded_model_by_any_shard(hub: HubEmulator, tmp_path: Path) -> None:
    r = cli("download", REPO, "SmolLM2-135M-Instruct-Q8_0-00002-of-00002.gguf")
    # The shards are not a real model: downloaded and verified, listed as unusable.
    assert r.returncode == 0, r.stderr
    snap = next((tmp_path / "hf" / "hub").rglob("snapshots/*"))
    assert sorted(p.name for p in snap.iterdir()) == [
        "SmolLM2-135M-Instruct-Q8_0-00001-of-00002.gguf",
        "SmolLM2-135M-Instruct-Q8_0-00002-of-00002.gguf",
    ]


def test_checksum_mismatch_exits_non_zero_and_lists_nothing(
    hub: HubEmulator, tmp_path: Path
) -> None:
    r = cli("download", "other/corrupt-GGUF", "c-Q4_1.gguf")
    msg = one_line_error(r)
    assert "corrupt" in msg and "SHA-256" in msg and "not in the library" in msg
    listed = json.loads(cli("list", "--json").stdout)
    assert all(m["file"] != "c-Q4_1.gguf" for m in listed)
    assert not [p for p in (tmp_path / "hf").rglob("*") if p.is_file()]


def test_gated_unknown_and_offline_are_one_line(
    hub: HubEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    gated = one_line_error(cli("download", "google/gated-GGUF", "g-Q4_1.gguf"))
    assert "gated" in gated and "accept" in gated and "HF_TOKEN" in gated
    assert "no repository called nobody/none" in one_line_error(cli("files", "nobody/none"))
    missing = one_line_error(cli("download", REPO, "nope.gguf"))
    assert "nope.gguf is not a GGUF file" in missing
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{s.getsockname()[1]}")
    assert "offline" in one_line_error(cli("search", "llama"))
    # Offline, the library still works.
    local = cli("list", "--json")
    assert local.returncode == 0 and any(m["id"] == "default" for m in json.loads(local.stdout))


def test_import_link_copy_and_bad_file(tmp_path: Path) -> None:
    src = tiny_gguf(tmp_path / "x" / "Tiny-F16.gguf", "tiny")
    r = cli("import", str(src))
    assert r.returncode == 0, r.stderr
    assert "as 'tiny-f16', linked" in r.stdout
    listed = {m["id"]: m for m in json.loads(cli("list", "--json").stdout)}
    assert listed["tiny-f16"]["linked"] and listed["tiny-f16"]["source"] == "imported"
    dup = one_line_error(cli("import", str(src), "--copy"))
    assert "already in the library" in dup
    removed = cli("delete", "tiny-f16", "--yes")
    assert removed.returncode == 0 and "freed 0 bytes" in removed.stdout and src.exists()
    copied = cli("import", str(src), "--copy")
    assert copied.returncode == 0 and "copied" in copied.stdout
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"<html>nope</html>" + b" " * 64)
    assert "HTML page" in one_line_error(cli("import", str(bad)))
    assert "cannot be deleted" in one_line_error(cli("delete", "default", "--yes"))


def test_token_without_a_keyring_points_to_hf_token(monkeypatch: pytest.MonkeyPatch) -> None:
    # keyring honours this variable when it first picks a backend: a fresh process sees no
    # usable backend, nothing is stored (this process's keyring chose its backend already).
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.fail.Keyring")
    r = subprocess.run(
        [sys.executable, "-m", "app.cli", "models", "token"],
        input="hf_NotStoredAnywhere\n",
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert "HF_TOKEN" in one_line_error(r)


def test_killed_download_resumes_where_it_stopped(
    hub: HubEmulator, tmp_path: Path, smollm2_path: Path
) -> None:
    hub.hold_at[(REPO, FILE)] = 12_000_000
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "models", "download", REPO, FILE],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert hub.held.wait(120)
        part = next((tmp_path / "hf").rglob("*.incomplete"))
    finally:
        proc.kill()  # no chance to save anything: the state file still says "downloading"
        proc.wait(60)
    kept = part.stat().st_size
    assert 0 < kept <= 12_000_000
    del hub.hold_at[(REPO, FILE)]
    hub.released.set()
    r = cli("download", REPO, FILE)
    assert r.returncode == 0, r.stderr
    last = [q for q in hub.file_requests(FILE) if q.get("cdn")][-1]
    assert last["range"] == f"bytes={kept}-"
    listed = json.loads(cli("list", "--json").stdout)
    path = Path(next(m["path"] for m in listed if m["source"] == "downloaded"))
    assert file_sha256(path) == file_sha256(smollm2_path)


def test_a_vision_model_downloads_with_its_projector_as_one_unit(
    hub: HubEmulator, smollm2_path: Path, vision_projector_path: Path
) -> None:
    repo = "ggml-org/SmolVLM-test-GGUF"
    r = hub.repo(repo)
    r.add("SmolVLM-test-Q4_1.gguf", source=smollm2_path)
    r.add("mmproj-SmolVLM-test-Q8_0.gguf", data=b"not this one")
    r.add("mmproj-SmolVLM-test-F16.gguf", source=vision_projector_path)
    got = cli("download", repo, "SmolVLM-test-Q4_1.gguf")
    assert got.returncode == 0, got.stderr
    size = human_bytes(smollm2_path.stat().st_size)
    assert (
        f"Downloaded and verified SmolVLM-test-Q4_1.gguf ({size}) and its projector "
        "mmproj-SmolVLM-test-F16.gguf -> " in got.stderr
    )
    listed = json.loads(cli("list", "--json").stdout)
    entry = next(m for m in listed if m["id"] == got.stdout.strip())
    # Beside it in the cache's snapshot folder: the library pairs them, the F16 one by rule.
    assert entry["capabilities"] == ["vision"]
    folder = Path(entry["path"]).parent
    assert file_sha256(folder / "mmproj-SmolVLM-test-F16.gguf") == file_sha256(
        vision_projector_path
    )
    assert not (folder / "mmproj-SmolVLM-test-Q8_0.gguf").exists()
    alone = cli("download", repo, "SmolVLM-test-Q4_1.gguf", "--no-projector")
    assert alone.returncode == 0 and "its projector" not in alone.stderr
