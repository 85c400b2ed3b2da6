"""Images in a benchmark: what each target sends for a prompt's images, the refusal of a
workload with images on a model that cannot read them, and the context such prompts need.

The embedded targets decode a prompt's image files per request (inside the request's time,
as a server decodes what a client sends) and build the media prompt through the model's
projector; the HTTP target sends the files as data URLs (OpenAI `image_url` parts, Ollama's
`images`). What the projector did is in each request's stats (`media_tokens`,
`media_encode_ms`) and so in the trace.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from engine.bench.result import BenchError
from engine.bench.workloads import MARKER, Prompt, Workload
from engine.media.images import decode_image
from engine.native.projector import Pixels

if TYPE_CHECKING:
    from engine.host.runtime import Model


def pixels(prompt: Prompt) -> list[Pixels]:
    """The prompt's images decoded, in marker order."""
    return [decode_image(im.data, im.name) for im in prompt.images]


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def openai_messages(prompt: Prompt) -> list[dict[str, Any]]:
    """The prompt's messages for an OpenAI-compatible server: a message with markers becomes
    content parts, its text split at each marker with that image's `image_url` between."""
    images = iter(prompt.images)
    out: list[dict[str, Any]] = []
    for m in prompt.messages:
        text = m["content"]
        if MARKER not in text:
            out.append(dict(m))
            continue
        parts: list[dict[str, Any]] = []
        for i, piece in enumerate(text.split(MARKER)):
            if i:
                im = next(images)
                url = data_url(im.data, im.mime)
                parts.append({"type": "image_url", "image_url": {"url": url}})
            if piece.strip():
                parts.append({"type": "text", "text": piece})
        out.append({"role": m["role"], "content": parts})
    return out


def ollama_messages(prompt: Prompt) -> list[dict[str, Any]]:
    """The prompt's messages for Ollama's chat API: the markers' images in the message's
    `images` (base64), the text without the markers."""
    images = iter(prompt.images)
    out: list[dict[str, Any]] = []
    for m in prompt.messages:
        n = m["content"].count(MARKER)
        msg: dict[str, Any] = {"role": m["role"], "content": m["content"].replace(MARKER, "")}
        if n:
            msg["images"] = [base64.b64encode(next(images).data).decode("ascii") for _ in range(n)]
        out.append(msg)
    return out


def needs_projector_message(workload: Workload, model_name: str) -> str:
    return (
        f"the {workload.name} workload sends images, and {model_name} was loaded without a "
        "vision projector (mmproj)"
    )


def check_reads_images(model: Model, workload: Workload) -> None:
    """`BenchError` (one line) when the workload has images and the model cannot read them."""
    if workload.images and (model.projector is None or not model.projector.vision):
        raise BenchError(needs_projector_message(workload, model.path.name))


def media_context_need(model: Model, workload: Workload, max_tokens_cap: int | None) -> int:
    """The most tokens a prompt with images takes with its whole answer (0: none has
    images), counted by the model's projector: images become many tokens, and the text
    tokenizer does not know how many."""
    need = 0
    for p in workload.prompts:
        if not p.images:
            continue
        mp = model.media_prompt(model.render_chat(list(p.messages)), pixels(p))
        try:
            n = len(mp.tokens)
        finally:
            mp.close()
        answer = min(p.max_tokens, max_tokens_cap) if max_tokens_cap else p.max_tokens
        need = max(need, n + answer)
    return need


__all__ = [
    "check_reads_images",
    "data_url",
    "media_context_need",
    "needs_projector_message",
    "ollama_messages",
    "openai_messages",
    "pixels",
]
