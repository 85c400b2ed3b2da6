"""Images and audio as each dialect sends them: the content parts' models, and `MediaPart`,
one image or clip as it was sent, with its path in the body for the errors.

A part is only checked for its shape here. What it holds (a data URL, base64, a picture
Pillow can read) is checked once the model is known (`engine.server.media_parts`): a model
without a projector refuses the first part by name whatever it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from engine.native.projector import marker
from engine.server.body_model import Body, refuse

Detail = Annotated[
    Literal["auto", "low", "high"] | None,
    Field(
        description="auto or high: the projector's own resolution (its tiles); low: the "
        "image is first scaled to at most 512 pixels a side (fewer tiles, fewer tokens)"
    ),
]


@dataclass(frozen=True)
class MediaPart:
    """An image or an audio clip of a request, still encoded.

    `data` is base64, or a URL where `url` is set (a data URL, or an http(s) one, refused);
    `where` is the part's path ("messages[0].content[1]") and `field` the path of its data
    inside it (".image_url.url"), `low` OpenAI's detail "low", `fmt` the audio's declared
    format."""

    kind: Literal["image", "audio"]
    where: str
    data: str
    url: bool = False
    low: bool = False
    fmt: str = "wav"
    field: str = ""

    @property
    def param(self) -> str:
        """The top-level field, as the errors' `param` names it."""
        return self.where.split("[", 1)[0].split(".", 1)[0]

    def stored(self) -> list[Any]:
        """As JSON, for a conversation kept by the Responses API's store."""
        return [self.kind, self.where, self.data, self.url, self.low, self.fmt, self.field]

    @classmethod
    def from_stored(cls, v: list[Any]) -> MediaPart:
        kind, where, data, url, low, fmt, field = v
        return cls(kind, where, data, url, low, fmt, field)


def media_text() -> str:
    """What stands for one part in a message's text (libmtmd's marker)."""
    return marker()


# -- OpenAI chat completions ---------------------------------------------------------------


class ImageUrl(Body):
    url: Annotated[str, Field(description="a data URL (data:image/png;base64,...)")]
    detail: Detail = None


class ImageUrlPart(Body):
    type: Literal["image_url"]
    image_url: ImageUrl

    def media(self, where: str) -> MediaPart:
        low = self.image_url.detail == "low"
        url = self.image_url.url
        return MediaPart("image", where, url, url=True, low=low, field=".image_url.url")


class InputAudio(Body):
    data: Annotated[str, Field(description="the audio file, base64")]
    format: Annotated[Literal["wav", "mp3"], Field(description="wav only: mp3 is refused")]


class InputAudioPart(Body):
    type: Literal["input_audio"]
    input_audio: InputAudio

    def media(self, where: str) -> MediaPart:
        a = self.input_audio
        return MediaPart("audio", where, a.data, fmt=a.format, field=".input_audio.data")


# -- OpenAI Responses ----------------------------------------------------------------------


class ResponsesImagePart(Body):
    type: Literal["input_image"]
    image_url: Annotated[
        str | None, Field(description="a data URL (data:image/png;base64,...)")
    ] = None
    detail: Detail = None
    file_id: Annotated[
        Any, Field(description="refused: files are not kept here; send a data URL in image_url")
    ] = None

    @model_validator(mode="before")
    @classmethod
    def _inline_only(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if data.get("file_id") is not None:
                raise refuse(
                    "has a file_id, which is not supported: this server keeps no files; "
                    "send the image as a data URL in image_url"
                )
            if data.get("image_url") is None:
                raise refuse("needs an image_url (data:image/png;base64,...)")
        return data

    def media(self, where: str) -> MediaPart:
        low = self.detail == "low"
        url = self.image_url or ""
        return MediaPart("image", where, url, url=True, low=low, field=".image_url")


# -- Anthropic Messages --------------------------------------------------------------------


class AnthropicImageSource(Body):
    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: Annotated[str, Field(description="the image file, base64")]

    @model_validator(mode="before")
    @classmethod
    def _inline_only(cls, data: Any) -> Any:
        kind = data.get("type") if isinstance(data, dict) else None
        if kind == "url":
            raise refuse(
                "is a URL, which this server does not fetch: send the image as a "
                'base64 source ({"type": "base64", "media_type": ..., "data": ...})'
            )
        if kind == "file":
            raise refuse(
                "is a file id, which is not supported: this server keeps no files; "
                "send the image as a base64 source"
            )
        return data
