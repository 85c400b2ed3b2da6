"""/v1/audio/transcriptions and /v1/audio/translations: OpenAI's multipart form fields (the
audio `file` aside) and its answers: `json` ({"text"}), `verbose_json` (language, duration,
segments), `text`, `srt` and `vtt`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, RootModel

from engine.server.body_model import Body
from engine.server.protocol.base import Reply

TranscriptFormat = Literal["json", "text", "srt", "vtt", "verbose_json"]
TEXT_TYPES: dict[str, str] = {
    "text": "text/plain",
    "srt": "application/x-subrip",
    "vtt": "text/vtt",
}


class TranslationForm(Body):
    """The form's fields besides `file` (the audio: WAV)."""

    model: Annotated[
        str,
        Field(
            description="Any name (OpenAI's whisper-1 too): the server transcribes with the "
            "model `serve --stt-model` named"
        ),
    ]
    prompt: Annotated[
        str | None, Field(description="Text the transcript continues (whisper's initial prompt)")
    ] = None
    response_format: TranscriptFormat | None = None
    temperature: Annotated[
        float | None,
        Field(description="Only 0: decoding is greedy, as whisper.cpp's at temperature 0"),
    ] = None


class TranscriptionForm(TranslationForm):
    language: Annotated[
        str | None,
        Field(description="ISO-639-1 code of the spoken language; detected when left out"),
    ] = None
    timestamp_granularities: Annotated[
        list[Literal["segment", "word"]] | None,
        Field(description='With verbose_json: "segment" (words are not timed by this server)'),
    ] = None


class Transcription(Reply):
    text: str


class TranscriptSegment(Reply):
    id: int
    start: float
    end: float
    text: str


class VerboseTranscription(Reply):
    task: Literal["transcribe", "translate"]
    language: str
    duration: float
    text: str
    segments: list[TranscriptSegment]


# The documented multipart bodies: the form's fields and the audio file.
# Not strict: a form's file arrives as bytes, a JSON test body's as a string.
_FILE = Field(strict=False, description="The audio: a WAV file (PCM, any rate and channels)")


class TranscriptionUpload(TranscriptionForm):
    file: Annotated[bytes, _FILE]


class TranslationUpload(TranslationForm):
    file: Annotated[bytes, _FILE]


class TranscriptionAnswer(RootModel[VerboseTranscription | Transcription]):
    """json's `{"text"}` or verbose_json's fuller answer."""


class SpeechToTextState(Reply):
    """/health's `speech_to_text`: the model `serve --stt-model` named, and once loaded (by
    the first request) the memory whisper.cpp takes for it (engine.memory.whisper)."""

    model: str
    loaded: bool
    memory_bytes: dict[str, int] | None = None
