"""/v1/audio/speech and /v1/audio/voices: OpenAI's text-to-speech body, and the voices list
in the shape kokoro-fastapi and Chatterbox answer it (Open WebUI reads `voices[].id`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from engine.server.body_model import Body, NotHonoured
from engine.server.protocol.base import Reply

# OpenAI's limit on the text of one request.
MAX_INPUT_CHARS = 4096
# OpenAI's speech models speak with whichever engine the voice is on; an engine's own name
# asks for one of its voices.
OPENAI_SPEECH_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
ENGINE_MODELS = {"espeak-ng": "espeak-ng", "kokoro": "kokoro"}
SpeechModel = Literal["tts-1", "tts-1-hd", "gpt-4o-mini-tts", "espeak-ng", "kokoro"]
# The formats this server writes. OpenAI's others (opus, aac, flac) are refused by name.
SpeechFormat = Literal["mp3", "wav", "pcm"]
CONTENT_TYPES: dict[str, str] = {"mp3": "audio/mpeg", "wav": "audio/wav", "pcm": "audio/pcm"}


class SpeechRequest(Body):
    model: Annotated[
        SpeechModel,
        Field(
            description="OpenAI's speech models speak with the voice's own engine; "
            '"espeak-ng" or "kokoro" take only that engine\'s voices'
        ),
    ]
    input: Annotated[str, Field(min_length=1, max_length=MAX_INPUT_CHARS)]
    voice: Annotated[
        str,
        Field(
            min_length=1,
            description='"default" always; GET /v1/audio/voices lists the others',
            examples=["default"],
        ),
    ]
    response_format: Annotated[
        SpeechFormat | None,
        Field(
            description="mp3 (the default, as OpenAI's), wav (16-bit mono) or pcm (16-bit "
            "little-endian mono samples at the voice's rate, named in X-Sample-Rate)"
        ),
    ] = None
    speed: Annotated[
        float | None,
        Field(
            ge=0.25, le=4.0, description="1.0: the voice's own pace; each voice's range is listed"
        ),
    ] = None
    instructions: Annotated[
        Any, NotHonoured("these voices take no instructions on how to speak", ("",))
    ] = None
    stream_format: Annotated[
        Literal["audio"] | None,
        Field(description='"audio": the file\'s bytes (server-sent events are not offered)'),
    ] = None


class VoiceEntry(Reply):
    id: str  # what `voice` takes
    name: str  # for a person
    engine: str
    language: str
    min_speed: float
    max_speed: float


class VoiceList(Reply):
    object: str
    voices: list[VoiceEntry]
