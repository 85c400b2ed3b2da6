"""/v1/audio/transcriptions and /v1/audio/translations through the official `openai` client,
on a server with the tiny random-weight whisper model (tests/speech_assets.py) and no chat
model: the text equals whisper.cpp's own whisper-cli's for the same file, model and threads."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from engine.memory.whisper import whisper_memory
from engine.model.whisper_file import read_whisper
from engine.server import ServerState, ServerThread
from engine.server.engine_state import ServedModel
from engine.speech.transcriber import DEFAULT_THREADS
from tests.engine.server.conftest import API_KEY, http, make_config
from tests.speech_assets import SpeechAssets, whisper_cli_text

THREADS = min(DEFAULT_THREADS, os.cpu_count() or 1)  # what the server's transcriber takes
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def server(speech_assets: SpeechAssets) -> Iterator[ServerThread]:
    config = make_config(stt_model=speech_assets.stt_model, max_body_bytes=4 << 20)
    state = ServerState(config)
    with ServerThread(state) as srv:
        # The model loads on the first request, in a process whose standard error a thread
        # reads, on the event loop's executor: all three start now, not in a test.
        with (
            openai.OpenAI(base_url=srv.url + "/v1", api_key=API_KEY, max_retries=0) as c,
            speech_assets.wavs["weather"].open("rb") as f,
        ):
            assert c.audio.transcriptions.create(model="whisper-1", file=f).text
        yield srv
    state.close()  # the speech-to-text process


@pytest.fixture
def client(server: ServerThread) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0) as c:
        yield c


def reference(cli: Path, assets: SpeechAssets, wav: str, **options: object) -> tuple[str, str]:
    path = assets.wavs[wav]
    return whisper_cli_text(cli, assets.stt_model, path, threads=THREADS, **options)  # type: ignore[arg-type]


def test_transcription_equals_whisper_cli(
    client: openai.OpenAI, speech_assets: SpeechAssets, whisper_cli: Path
) -> None:
    with speech_assets.wavs["lighthouse"].open("rb") as f:
        got = client.audio.transcriptions.create(model="whisper-1", file=f)
    text, _ = reference(whisper_cli, speech_assets, "lighthouse")
    assert got.text and got.text == text


def test_translation_and_prompt_equal_whisper_cli(
    client: openai.OpenAI, speech_assets: SpeechAssets, whisper_cli: Path
) -> None:
    # this openai client marks translations deprecated; OpenAI still serves them
    with speech_assets.wavs["weather"].open("rb") as f, pytest.deprecated_call():
        got = client.audio.translations.create(model="whisper-1", file=f, prompt="Paris")
    text, _ = reference(whisper_cli, speech_assets, "weather", translate=True, prompt="Paris")
    assert got.text and got.text == text


def test_response_formats(
    client: openai.OpenAI, speech_assets: SpeechAssets, whisper_cli: Path
) -> None:
    wav = speech_assets.wavs["weather"]
    text, language = reference(whisper_cli, speech_assets, "weather", language="en")
    with wav.open("rb") as f:
        verbose = client.audio.transcriptions.create(
            model="whisper-1",
            file=f,
            language="en",
            response_format="verbose_json",
            timestamp_granularities=["segment"],
            temperature=0,
        )
    assert verbose.text == text and verbose.language == language
    assert verbose.duration == pytest.approx(wav.stat().st_size / 2 / 16000, abs=0.01)
    segments = verbose.segments or []
    assert segments and " ".join(s.text for s in segments).split() == text.split()
    with wav.open("rb") as f:
        plain = client.audio.transcriptions.create(
            model="whisper-1", file=f, language="en", response_format="text"
        )
    assert plain.strip() == text
    for fmt, first in (("srt", "1\n"), ("vtt", "WEBVTT\n")):
        with wav.open("rb") as f:
            subtitles = client.audio.transcriptions.create(
                model="whisper-1", file=f, language="en", response_format=fmt
            )
        assert isinstance(subtitles, str) and subtitles.startswith(first)
        s0 = segments[0]
        sep = "," if fmt == "srt" else "."
        assert f"00:00:{s0.start:06.3f}".replace(".", sep) in subtitles
        assert all(s.text in subtitles for s in segments)


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"temperature": 0.4}, "temperature"),
        ({"language": "xx"}, "language"),
        ({"response_format": "mp3"}, "response_format"),
        ({"timestamp_granularities": ["word"]}, "timestamp_granularities"),
    ],
)
def test_refused_fields_are_named(
    client: openai.OpenAI, speech_assets: SpeechAssets, options: dict[str, object], param: str
) -> None:
    with (
        speech_assets.wavs["weather"].open("rb") as f,
        pytest.raises(openai.BadRequestError) as e,
    ):
        client.audio.transcriptions.create(model="whisper-1", file=f, **options)  # type: ignore[call-overload]
    assert e.value.body["param"] == param  # type: ignore[index]
    assert "\n" not in e.value.body["message"]  # type: ignore[index]


def test_a_file_that_is_not_wav_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="not a WAV file") as e:
        client.audio.transcriptions.create(model="whisper-1", file=("a.mp3", b"ID3" + bytes(64)))
    assert e.value.body["param"] == "file"  # type: ignore[index]


def test_without_a_speech_model_the_answer_says_how_to_start_one(tmp_path: Path) -> None:
    with (
        ServerThread(ServerState(make_config())) as srv,
        openai.OpenAI(base_url=srv.url + "/v1", api_key=API_KEY, max_retries=0) as c,
        pytest.raises(openai.BadRequestError, match="--stt-model"),
    ):
        c.audio.transcriptions.create(model="whisper-1", file=("a.wav", b"RIFF"))


def test_health_counts_the_speech_model_once_loaded(
    served: ServedModel, speech_assets: SpeechAssets
) -> None:
    """/health names the --stt-model; after the first transcription, whisper.cpp's memory
    for it (engine.memory.whisper's estimate, checked against whisper.cpp's own figures)."""
    config = make_config(stt_model=speech_assets.stt_model, max_body_bytes=4 << 20)
    state = ServerState(config)
    state.set_loaded(served)
    expected = whisper_memory(read_whisper(speech_assets.stt_model), best_of=1).total
    try:
        with ServerThread(state) as srv:
            before = http.get(srv.url + "/health", headers=AUTH).json()["speech_to_text"]
            assert before == {"model": "stt.bin", "loaded": False}
            with speech_assets.wavs["weather"].open("rb") as f:
                r = http.post(
                    srv.url + "/v1/audio/transcriptions",
                    headers=AUTH,
                    files={"file": f},
                    data={"model": "whisper-1", "response_format": "text"},
                )
            assert r.status_code == 200 and r.text.strip()
            after = http.get(srv.url + "/health", headers=AUTH).json()["speech_to_text"]
            assert after == {"model": "stt.bin", "loaded": True, "memory_bytes": {"CPU": expected}}
            assert expected > speech_assets.stt_model.stat().st_size
    finally:
        state.set_loaded(None)
        state.close()


def test_serve_refuses_a_stt_model_that_is_not_one_in_one_line(tmp_path: Path) -> None:
    """--stt-model is checked at start (its header and tensor table), before any load."""
    from tests.app.cli_inproc import run_cli

    bad = tmp_path / "ggml-tiny.bin"
    bad.write_bytes(b"GGUF" + bytes(60))
    r = run_cli("serve", "--port", "0", "--stt-model", str(bad))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "ggml-tiny.bin" in lines[0], r.stderr


def test_serve_defaults_to_the_model_chosen_for_speech_to_text(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without --stt-model, serve takes the model chosen with `models use-stt` (this test's
    private home); one that no longer reads as a whisper model is a warning, not a failure."""
    from app.cli.serve_cmd import _stt_model
    from app.services.speech_models import choose_stt_model
    from tests.speech_assets import write_whisper_model

    assert _stt_model(None) is None  # a fresh profile: none chosen
    model = write_whisper_model(tmp_path / "ggml-test.bin")
    choose_stt_model(model)
    assert _stt_model(None) == model.resolve()
    model.write_bytes(model.read_bytes()[:1000])  # cut short after it was chosen
    assert _stt_model(None) is None
    assert "ggml-test.bin" in caplog.text
