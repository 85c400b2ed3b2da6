"""A request's images and audio, read for the served model: every dialect's routes collect
their parts (`protocol.media.MediaPart`, one `marker()` each in the messages' text, in order)
and `decode_media` turns them into the `Media` that `plan_chat` takes.

Each refusal is a 400 naming the part's path, first the model's (no projector, or one that
reads the other kind), then the part's own: an http(s) URL (not fetched), a data URL that is
not base64, base64 that is not, audio that is not WAV, and Pillow's or the WAV reader's
one-line `MediaError`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Sequence

from PIL import Image

from engine.media.audio import decode_wav
from engine.media.images import MediaError, decode_image
from engine.native.projector import Media, Pixels, Projector
from engine.server.engine_state import ServedModel
from engine.server.errors import ApiError
from engine.server.protocol.media import MediaPart

LOW_DETAIL_SIDE = 512  # OpenAI's "low" detail: the image at most this many pixels a side

URL_REFUSED = (
    "is an http(s) URL, which this server does not fetch: send the image inline as a "
    "data URL (data:image/png;base64,...)"
)


async def decode_media(loaded: ServedModel, parts: Sequence[MediaPart]) -> list[Media]:
    """The parts decoded for `loaded`'s projector (on the model's media thread: a photo takes
    a while), or a 400 naming the first part at fault."""
    if not parts:
        return []
    proj = loaded.model.projector
    if proj is None:
        first = parts[0]
        raise _refused(
            first,
            f"{loaded.model_id} reads text only: it was loaded without a projector (mmproj)",
            own=False,
        )
    for p in parts:
        _check_kind(loaded.model_id, proj, p)

    def work() -> list[Media]:
        return [_decode(proj, p) for p in parts]

    if loaded.media_executor is None:  # served without one: on the event loop
        return work()
    return await asyncio.get_running_loop().run_in_executor(loaded.media_executor, work)


def _refused(part: MediaPart, message: str, *, own: bool = True) -> ApiError:
    """`own`: a refusal of the part's data (named with its field), else of the part."""
    text = f"'{part.where}{part.field}' {message}" if own else f"'{part.where}': {message}"
    return ApiError(400, text, param=part.param)


def _check_kind(model_id: str, proj: Projector, part: MediaPart) -> None:
    if part.kind == "image" and not proj.vision:
        raise _refused(part, f"{model_id}'s projector reads audio, not images", own=False)
    if part.kind == "audio" and not proj.audio:
        raise _refused(part, f"{model_id}'s projector reads images, not audio", own=False)


def _decode(proj: Projector, part: MediaPart) -> Media:
    if part.kind == "audio" and part.fmt != "wav":
        raise ApiError(
            400,
            f"'{part.where}.input_audio.format' is '{part.fmt}': only WAV audio is read here "
            "(send 16-bit PCM WAV)",
            param=part.param,
        )
    data = _bytes(part)
    name = f"'{part.where}'"
    try:
        if part.kind == "audio":
            return decode_wav(data, proj.audio_rate, name)
        pixels = decode_image(data, name)
    except MediaError as e:
        raise ApiError(400, str(e), param=part.param) from None
    return _low_detail(pixels) if part.low else pixels


def _bytes(part: MediaPart) -> bytes:
    text = part.data
    if part.url:
        if text.startswith(("http://", "https://")):
            raise _refused(part, URL_REFUSED)
        head, comma, text = text.partition(",")
        if not (comma and head.startswith("data:image/") and head.endswith(";base64")):
            raise _refused(
                part, "must be a base64 data URL of an image (data:image/png;base64,...)"
            )
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise _refused(part, "is not valid base64") from None


def _low_detail(p: Pixels) -> Pixels:
    if max(p.width, p.height) <= LOW_DETAIL_SIDE:
        return p
    im = Image.frombytes("RGB", (p.width, p.height), p.rgb)
    im.thumbnail((LOW_DETAIL_SIDE, LOW_DETAIL_SIDE), Image.Resampling.LANCZOS)
    return Pixels(im.width, im.height, im.tobytes())
