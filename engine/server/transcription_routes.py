"""Speech to text: OpenAI's /v1/audio/transcriptions and /v1/audio/translations.

The transcription model is the whisper.cpp file `serve --stt-model` named
(`ServerConfig.stt_model`); it is loaded on the first request, in its own process
(engine.speech.transcriber), and kept. Without one, both routes answer 400 saying so. The
form is OpenAI's multipart one: the audio `file` (WAV) and its fields
(engine.server.protocol.transcription); a field the server cannot honour (a temperature
above 0, word timestamps) is a 400 naming it. Work runs on a worker thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from engine.errors import EngineError
from engine.media.images import MediaError
from engine.memory.whisper import whisper_memory
from engine.server.engine_state import ServerState
from engine.server.errors import ApiError
from engine.server.protocol.parse import parse_body
from engine.server.protocol.transcription import (
    TEXT_TYPES,
    SpeechToTextState,
    Transcription,
    TranscriptionForm,
    TranscriptionUpload,
    TranscriptSegment,
    TranslationUpload,
    VerboseTranscription,
)
from engine.speech.transcriber import Transcriber, Transcript, TranscriptionRefused

NO_MODEL = (
    "no speech-to-text model is loaded: start the server with --stt-model PATH "
    "(a whisper.cpp model file)"
)
T = TypeVar("T")


class TranscriptionRoutes:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self._lock = threading.Lock()
        self._transcriber: Transcriber | None = None
        state.on_close.append(self.close)

    def routes(self) -> list[Route]:
        return [
            Route("/v1/audio/transcriptions", self.transcribe, methods=["POST"]),
            Route("/v1/audio/translations", self.translate, methods=["POST"]),
        ]

    async def transcribe(self, request: Request) -> Response:
        return await self._answer(request, translate=False)

    async def translate(self, request: Request) -> Response:
        return await self._answer(request, translate=True)

    def status(self) -> SpeechToTextState | None:
        """For /health: the model named, whether it is loaded, its memory once it is."""
        path = self.state.config.stt_model
        if path is None:
            return None
        loaded = self._transcriber
        if loaded is None:
            return SpeechToTextState(model=path.name, loaded=False)
        # greedy without fallback: one decoder, so no fallback cache (best_of=1)
        memory = {"CPU": whisper_memory(loaded.model, best_of=1).total}
        return SpeechToTextState(model=path.name, loaded=True, memory_bytes=memory)

    def close(self) -> None:
        with self._lock:
            if self._transcriber is not None:
                self._transcriber.close()
                self._transcriber = None

    async def _answer(self, request: Request, *, translate: bool) -> Response:
        fields = await self._form(request)
        # The documented bodies, the audio included: what is parsed is what the document shows.
        form: TranslationUpload | TranscriptionUpload = (
            parse_body(TranslationUpload, fields)
            if translate
            else parse_body(TranscriptionUpload, fields)
        )
        audio = form.file
        if form.temperature not in (None, 0):
            raise ApiError(
                400,
                f"'temperature' {form.temperature:g} is not supported: this server decodes "
                "greedily (temperature 0)",
                param="temperature",
            )
        fmt = form.response_format or "json"
        language = form.language if isinstance(form, TranscriptionForm) else None
        if isinstance(form, TranscriptionForm) and "word" in (form.timestamp_granularities or []):
            raise ApiError(
                400,
                "'timestamp_granularities' 'word' is not supported",
                param="timestamp_granularities",
            )
        transcript = await _off_loop(
            lambda: self._run(audio, language=language, translate=translate, prompt=form.prompt)
        )
        if fmt == "json":
            return JSONResponse(Transcription(text=transcript.text).wire())
        if fmt == "verbose_json":
            return JSONResponse(_verbose(transcript, translate).wire())
        body = {"text": transcript.text + "\n", "srt": srt(transcript), "vtt": vtt(transcript)}
        return PlainTextResponse(body[fmt], media_type=TEXT_TYPES[fmt])

    async def _form(self, request: Request) -> dict[str, Any]:
        kind = request.headers.get("content-type", "")
        if not kind.startswith("multipart/form-data"):
            raise ApiError(400, "send the audio as multipart/form-data with a 'file' field")
        limit = self.state.config.max_body_bytes
        if int(request.headers.get("content-length") or 0) > limit:
            raise ApiError(413, f"the request is larger than {limit >> 20} MiB")
        fields: dict[str, Any] = {}
        audio: bytes | None = None
        async with request.form() as form:
            for key, value in form.multi_items():
                if isinstance(value, UploadFile):
                    if key != "file":
                        raise ApiError(400, f"unexpected file field '{key}'", param=key)
                    audio = await value.read()
                elif key in ("timestamp_granularities[]", "timestamp_granularities"):
                    fields.setdefault("timestamp_granularities", []).append(value)
                elif key == "temperature":
                    fields[key] = _number(value)
                else:
                    fields[key] = value
        if audio is None:
            raise ApiError(400, "'file' is required: the audio, as a WAV file", param="file")
        return {**fields, "file": audio}

    def _run(
        self, audio: bytes, *, language: str | None, translate: bool, prompt: str | None
    ) -> Transcript:
        with self._lock:  # one transcription at a time; the first loads the model
            transcriber = self._loaded()
            try:
                return transcriber.transcribe_wav(
                    audio, language=language, translate=translate, prompt=prompt
                )
            except MediaError as e:
                raise ApiError(400, f"'file': {e}", param="file") from None
            except TranscriptionRefused as e:
                raise ApiError(400, str(e), param=e.field) from None
            except EngineError as e:
                raise ApiError(500, str(e)) from None

    def _loaded(self) -> Transcriber:
        if self._transcriber is None:
            path = self.state.config.stt_model
            if path is None:
                raise ApiError(400, NO_MODEL, param="model")
            try:
                self._transcriber = Transcriber(path)
            except EngineError as e:
                raise ApiError(500, str(e)) from None
        return self._transcriber


def _number(value: str) -> float | str:
    try:
        return float(value)
    except ValueError:
        return value  # refused by the form's model, naming the field


def _verbose(t: Transcript, translate: bool) -> VerboseTranscription:
    return VerboseTranscription(
        task="translate" if translate else "transcribe",
        language=t.language,
        duration=round(t.audio_seconds, 3),
        text=t.text,
        segments=[
            TranscriptSegment(id=i, start=s.start_s, end=s.end_s, text=s.text)
            for i, s in enumerate(t.segments)
        ],
    )


def _clock(seconds: float, sep: str) -> str:
    ms = round(seconds * 1000)
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def srt(t: Transcript) -> str:
    cues = [
        f"{i}\n{_clock(s.start_s, ',')} --> {_clock(s.end_s, ',')}\n{s.text}\n"
        for i, s in enumerate(t.segments, 1)
    ]
    return "\n".join(cues)


def vtt(t: Transcript) -> str:
    cues = [f"{_clock(s.start_s, '.')} --> {_clock(s.end_s, '.')}\n{s.text}\n" for s in t.segments]
    return "\n".join(["WEBVTT\n", *cues])


async def _off_loop(work: Callable[[], T]) -> T:
    return await asyncio.get_running_loop().run_in_executor(None, work)
