"""Text to speech: OpenAI's /v1/audio/speech, and /v1/audio/voices listing what `voice` takes.

The speech is made by `engine.speech.synth` (espeak-ng's `default` always, Kokoro when the
`voice` extra is installed) on a worker thread, so the event loop and the models' streams go
on meanwhile. No chat model is involved: the route answers on a server with none loaded.
The answer is the whole file; without `response_format`, MP3, as OpenAI answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engine.errors import EngineError
from engine.server.engine_state import ServerState
from engine.server.errors import ApiError
from engine.server.parsing import read_json
from engine.server.protocol.parse import parse_body
from engine.server.protocol.speech import (
    CONTENT_TYPES,
    ENGINE_MODELS,
    SpeechRequest,
    VoiceEntry,
    VoiceList,
)
from engine.speech.pcm import Pcm, to_mp3, to_pcm_bytes, to_wav
from engine.speech.synth import Synthesizer, UnknownVoice, Voice, synthesizer

DEFAULT_FORMAT = "mp3"
SAMPLE_RATE_HEADER = "X-Sample-Rate"  # a pcm answer's rate, which the bytes do not carry
_ENCODERS: dict[str, Callable[[Pcm], bytes]] = {
    "mp3": to_mp3,
    "wav": to_wav,
    "pcm": to_pcm_bytes,
}
T = TypeVar("T")


class SpeechRoutes:
    def __init__(self, state: ServerState, speech: Synthesizer | None = None) -> None:
        self.state = state
        self.speech = speech or synthesizer()

    def routes(self) -> list[Route]:
        return [
            Route("/v1/audio/speech", self.speak, methods=["POST"]),
            Route("/v1/audio/voices", self.voices, methods=["GET"]),
        ]

    async def voices(self, request: Request) -> Response:
        found = await _off_loop(self.speech.voices)
        answer = VoiceList(object="list", voices=[_entry(v) for v in found])
        return JSONResponse(answer.wire())

    async def speak(self, request: Request) -> Response:
        body = await read_json(request, self.state.config.max_body_bytes)
        req = parse_body(SpeechRequest, body)
        fmt = req.response_format or DEFAULT_FORMAT
        data, rate = await _off_loop(lambda: self._speak(req, fmt))
        return Response(
            data,
            media_type=CONTENT_TYPES[fmt],
            headers={SAMPLE_RATE_HEADER: str(rate)},
        )

    def _speak(self, req: SpeechRequest, fmt: str) -> tuple[bytes, int]:
        """The file's bytes and the samples' rate (on a worker thread)."""
        voice = self._voice(req)
        speed = 1.0 if req.speed is None else req.speed
        if not voice.min_speed <= speed <= voice.max_speed:
            raise ApiError(
                400,
                f"'speed' {speed:g} is outside voice {voice.name!r}'s range, "
                f"{voice.min_speed:.2f} to {voice.max_speed:g}",
                param="speed",
            )
        try:
            pcm = self.speech.synthesize(req.input, voice.name, speed)
            return _ENCODERS[fmt](pcm), pcm.rate
        except EngineError as e:
            raise ApiError(500, str(e)) from None

    def _voice(self, req: SpeechRequest) -> Voice:
        try:
            voice = self.speech.voice(req.voice)
        except UnknownVoice:
            raise ApiError(
                400,
                f"'voice' {req.voice!r} is not a voice of this server "
                "(GET /v1/audio/voices lists them)",
                param="voice",
            ) from None
        engine = ENGINE_MODELS.get(req.model)
        if engine is not None and voice.engine != engine:
            raise ApiError(
                400,
                f"'voice' {voice.name!r} is {voice.engine}'s, and model {req.model!r} speaks "
                f"only with {engine}'s voices",
                param="voice",
            )
        return voice


def _entry(v: Voice) -> VoiceEntry:
    return VoiceEntry(
        id=v.name,
        name=v.description,
        engine=v.engine,
        language=v.language,
        min_speed=v.min_speed,
        max_speed=v.max_speed,
    )


async def _off_loop(work: Callable[[], T]) -> T:
    """Blocking speech work (a voice loading, samples synthesised) on a worker thread."""
    return await asyncio.get_running_loop().run_in_executor(None, work)
