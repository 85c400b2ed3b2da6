"""Speech-to-text (whisper.cpp) models through `candlewick models`, against the local Hub
emulator: found by a speech search, listed by quantization like GGUF quants, downloaded and
verified by the download manager, listed with their kind and memory, chosen as the
transcription model; a chat model is never a speech model and the other way round."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.services.library import ModelLibrary
from app.services.paths import AppPaths
from app.services.speech_models import current_stt_model
from engine.memory.whisper import memory_of, whisper_memory
from engine.model.gguf import human_bytes
from engine.model.whisper_file import HEADER_BYTES, parse_hparams, read_whisper
from tests.app.cli_inproc import run_cli
from tests.hub_emulator import HubEmulator, file_sha256, running_hub
from tests.speech_assets import write_whisper_model
from tests.whisper_bin import tensor_count, whisper_bytes
from tests.whisper_reference import whisper_cpp_figures

REPO = "ggerganov/whisper.cpp"
TINY = "ggml-tiny.bin"
TINY_Q5 = "ggml-tiny-q5_1.bin"
# whisper tiny's header (multilingual, 4 layers of 384), small tensors: the library reads
# the header only.
TINY_HP = {
    "n_vocab": 51865,
    "n_audio_ctx": 1500,
    "n_audio_state": 384,
    "n_audio_head": 6,
    "n_audio_layer": 4,
    "n_text_ctx": 448,
    "n_text_state": 384,
    "n_text_head": 6,
    "n_text_layer": 4,
}


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubEmulator]:
    with running_hub() as emu:
        r = emu.repo(REPO, downloads=500, tags=["automatic-speech-recognition"])
        r.add(TINY, data=whisper_bytes(TINY_HP, vocab=[b"a"]))
        r.add(TINY_Q5, data=whisper_bytes({**TINY_HP, "ftype": 1009}, vocab=[b"b"]))
        r.add("for-tests-ggml-tiny.bin", data=b"stub")
        r.add("ggml-silero-v5.1.2.bin", data=b"vad")
        r.add("ggml-tiny-encoder.mlmodelc.zip", data=b"zip")
        emu.repo("broken/whisper", tags=["automatic-speech-recognition"]).add(
            TINY, data=whisper_bytes(TINY_HP, vocab=[b"a"])
        )
        emu.corrupt.add(("broken/whisper", TINY))
        monkeypatch.setenv("HF_ENDPOINT", emu.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        yield emu


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("models", *args)


def one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.strip().splitlines() if not ln.startswith("downloading:")]
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_speech_search_and_files(hub: HubEmulator) -> None:
    found = json.loads(cli("search", "whisper", "--speech", "--json").stdout)
    assert [f["repo"] for f in found] == [REPO, "broken/whisper"]
    # A GGUF search does not offer it: it has no GGUF files.
    assert json.loads(cli("search", "whisper", "--json").stdout) == []
    out = json.loads(cli("files", REPO, "--json").stdout)
    files = {f["file"]: f for f in out["files"]}
    # whisper.cpp's test stubs, its VAD model and Core ML encoders are not speech models.
    assert set(files) == {TINY, TINY_Q5}
    assert files[TINY]["kind"] == files[TINY_Q5]["kind"] == "speech"
    assert (files[TINY]["quantization"], files[TINY_Q5]["quantization"]) == ("F16", "Q5_1")
    # The memory whisper.cpp will take, from the file's hyper-parameters read by range, the
    # file's size standing for the weights.
    head = hub.repos[REPO].files[TINY_Q5].read(0, HEADER_BYTES)
    expected = memory_of(parse_hparams(head, TINY_Q5), files[TINY_Q5]["size_bytes"]).total
    assert files[TINY_Q5]["fit"] == f"needs {human_bytes(expected)}"
    assert {r["range"] for r in hub.file_requests(TINY_Q5)} == {"bytes=0-47"}  # never the file
    table = cli("files", REPO).stdout
    assert f"(speech to text) needs {human_bytes(expected)}" in table
    quick = cli("files", REPO, "--no-fit").stdout
    assert "(speech to text)" in quick and "needs" not in quick and "Q5_1" in quick


def test_download_verified_listed_with_memory_and_chosen(
    hub: HubEmulator, tmp_path: Path, smollm2_path: Path
) -> None:
    r = cli("download", REPO, TINY_Q5)
    assert r.returncode == 0, r.stderr
    assert "Downloaded and verified" in r.stderr
    model_id = r.stdout.strip()
    assert model_id == "ggml-tiny-q5_1"
    listed = json.loads(cli("list", "--json").stdout)
    speech = next(m for m in listed if m["id"] == model_id)
    path = Path(speech["path"])
    assert str(path).startswith(str(tmp_path / "hf" / "hub"))
    assert file_sha256(path) == hub.repos[REPO].files[TINY_Q5].sha256
    assert speech["kind"] == "speech-to-text" and speech["source"] == "downloaded"
    assert speech["label"] == f"{REPO}/{TINY_Q5}"
    assert (speech["model_type"], speech["quantization"]) == ("tiny", "q5_1")
    assert speech["memory_bytes"] == whisper_memory(read_whisper(path)).total
    assert speech["chosen"] is False
    # The chat library leaves it out; the GGUF models say what they are.
    chat = ModelLibrary(AppPaths.default().models).entries()
    assert all(e.path != path for e in chat)
    assert next(m for m in listed if m["id"] == "default")["kind"] == "text"
    table = cli("list").stdout
    row = next(line for line in table.splitlines() if line.startswith(model_id))
    assert "speech-to-text" in row and "Q5_1" in row
    assert f"memory {human_bytes(speech['memory_bytes'])}" in row

    chosen = cli("use-stt", model_id)
    assert chosen.returncode == 0, chosen.stderr
    assert "whisper tiny (multilingual) · q5_1" in chosen.stdout
    assert current_stt_model() == path
    assert next(m for m in json.loads(cli("list", "--json").stdout) if m["id"] == model_id)[
        "chosen"
    ]
    # A chat model is refused as the transcription model; the choice stays.
    refused = one_line_error(cli("use-stt", str(smollm2_path)))
    assert "is a GGUF model, not a whisper.cpp speech model" in refused
    assert "no speech-to-text model called 'default'" in one_line_error(cli("use-stt", "default"))
    assert current_stt_model() == path
    assert model_id in cli("use-stt").stdout
    assert cli("use-stt", "--clear").returncode == 0 and current_stt_model() is None

    # Deleting it asks first, frees the blob, and undoes the choice.
    assert cli("use-stt", model_id).returncode == 0
    size = path.stat().st_size
    assert "add --yes" in one_line_error(cli("delete", model_id)) and path.exists()
    gone = cli("delete", model_id, "--yes")
    assert gone.returncode == 0, gone.stderr
    assert f"freed {human_bytes(size)}" in gone.stdout
    assert not path.exists() and not path.is_symlink()
    assert not [p for p in (tmp_path / "hf" / "hub").rglob("blobs/*")]
    assert current_stt_model() is None
    assert model_id not in {m["id"] for m in json.loads(cli("list", "--json").stdout)}


def test_a_corrupt_download_is_not_listed(hub: HubEmulator, tmp_path: Path) -> None:
    msg = one_line_error(cli("download", "broken/whisper", TINY))
    assert "SHA-256" in msg
    assert all(m["file"] != TINY for m in json.loads(cli("list", "--json").stdout))


def test_import_and_choose_in_place(tmp_path: Path) -> None:
    src = tmp_path / "ggml-base.en.bin"
    src.write_bytes(whisper_bytes({**TINY_HP, "n_audio_layer": 6, "n_vocab": 51864}))
    refused = one_line_error(cli("import", str(src)))
    assert "is a speech-to-text model: import it with --copy" in refused
    # Never a chat model: `run` says what it is, in one line.
    chat = one_line_error(run_cli("run", str(src), "hi"))
    assert "not a GGUF model: this is a whisper.cpp speech-to-text model" in chat
    r = cli("import", str(src), "--copy")
    assert r.returncode == 0, r.stderr
    assert "as 'ggml-base.en' (speech to text)" in r.stdout
    listed = {m["id"]: m for m in json.loads(cli("list", "--json").stdout)}
    assert listed["ggml-base.en"]["source"] == "imported"
    assert listed["ggml-base.en"]["model_type"] == "base"
    # A file left where it is: chosen by its path, listed as the chosen one.
    elsewhere = tmp_path / "other" / "ggml-tiny.bin"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(whisper_bytes(TINY_HP))
    assert cli("use-stt", str(elsewhere)).returncode == 0
    listed = {m["id"]: m for m in json.loads(cli("list", "--json").stdout)}
    assert listed["ggml-tiny"]["source"] == "chosen" and listed["ggml-tiny"]["chosen"]
    # Not the library's file: never deleted from here.
    assert "is not the library's file" in one_line_error(cli("delete", "ggml-tiny", "--yes"))
    assert elsewhere.exists()
    copy = Path(listed["ggml-base.en"]["path"])
    assert cli("delete", "ggml-base.en", "--yes").returncode == 0 and not copy.exists()
    assert src.exists()
    cut = tmp_path / "ggml-cut.bin"
    cut.write_bytes(whisper_bytes(TINY_HP)[:-10])
    assert "cut short" in one_line_error(cli("use-stt", str(cut)))


@pytest.mark.model
def test_the_test_model_from_the_hub_is_what_whisper_cpp_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The random-weight test model (tests/speech_assets.py, the file
    scripts/make_test_speech_models.py writes) served by the emulator: downloaded, listed
    with a memory estimate that matches what whisper.cpp allocates for the downloaded file."""
    model = write_whisper_model(tmp_path / "src" / "ggml-test.bin")
    with running_hub() as emu:
        emu.repo("candlewick/whisper-test", tags=["automatic-speech-recognition"]).add(
            "ggml-test.bin", source=model
        )
        monkeypatch.setenv("HF_ENDPOINT", emu.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        r = cli("download", "candlewick/whisper-test", "ggml-test.bin")
    assert r.returncode == 0, r.stderr
    listed = next(m for m in json.loads(cli("list", "--json").stdout) if m["id"] == "ggml-test")
    path = Path(listed["path"])
    assert file_sha256(path) == file_sha256(model)
    logged = whisper_cpp_figures(path)
    allocated = sum(logged.values()) * 1e6  # weights, caches, compute buffers
    m = whisper_memory(read_whisper(path))
    assert listed["memory_bytes"] == m.total
    # The estimate's load figure against whisper.cpp's (its conv buffer may be over by up
    # to 3.1 MB for a model this narrow), plus the logits and fallback it adds.
    assert 0 <= m.at_load - m.logits - allocated <= 3.2e6
    assert cli("use-stt", "ggml-test").returncode == 0 and current_stt_model() == path


def test_a_dropped_download_resumes_where_it_stopped(hub: HubEmulator) -> None:
    name = "ggml-tiny.en.bin"
    n = tensor_count({**TINY_HP})
    big = [("decoder.token_embedding.weight", 0, (1024, 1024))]  # 4 MB: several writes
    data = whisper_bytes(
        TINY_HP, vocab=[b"a"], tensors=big + [(f"f{i}", 0, (4,)) for i in range(n - 1)]
    )
    hub.repos[REPO].add(name, data=data)
    hub.drop_after[(REPO, name)] = 3_000_000
    r = cli("download", REPO, name)
    assert r.returncode == 0, r.stderr
    gets = [q for q in hub.file_requests(name) if q.get("cdn")]
    assert len(gets) == 2 and gets[0]["range"] is None
    resumed_from = int(gets[1]["range"][len("bytes=") : -1])
    assert 0 < resumed_from <= 3_000_000  # from the bytes on disk, not from zero
    listed = next(m for m in json.loads(cli("list", "--json").stdout) if m["file"] == name)
    assert file_sha256(Path(listed["path"])) == hub.repos[REPO].files[name].sha256
