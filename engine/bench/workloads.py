"""Benchmark workloads: prompt sets in JSONL, one request per line.

A line is `{"messages": [{"role": ..., "content": ...}, ...], "max_tokens": N, "id": "..."}`;
`{"prompt": "..."}` is accepted as a single user message. `max_tokens` is the realistic output
length of that prompt (the benchmark may cap it). The shipped sets live in
resources/workloads/ and are chosen by name: chat, rag, code, vision.

A line may carry images: `"images": ["pictures/a.png", ...]`, paths relative to the workload
file (or absolute). They go where the messages' text has `<__media__>` markers, one each in
order; a line whose text has no marker gets them all at the start of its first user message.
Each file is read and decoded here, so a missing or unreadable image is refused before
anything runs; a target decodes the bytes again per request, as a server does.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.media.images import MediaError, decode_image

BUILTIN_DIR = Path(__file__).resolve().parents[2] / "resources" / "workloads"
BUILTIN = ("chat", "rag", "code", "vision")
DEFAULT_MAX_TOKENS = 256
_ROLES = frozenset({"system", "user", "assistant"})
# libmtmd's default media marker (engine.native.projector.marker), spelled out so that
# reading a workload does not load libmtmd.
MARKER = "<__media__>"
_MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}


class WorkloadError(ValueError):
    """A workload file that cannot be used; `str()` is one line naming the file and line."""


@dataclass(frozen=True)
class WorkloadImage:
    """An image of a prompt: its file's bytes, read and checked when the workload loads."""

    path: Path
    data: bytes = field(repr=False)
    mime: str
    width: int
    height: int

    @property
    def name(self) -> str:
        return self.path.name


@dataclass(frozen=True)
class Prompt:
    id: str
    messages: tuple[dict[str, str], ...]
    max_tokens: int
    # In the order of the messages' markers (MARKER), one marker each.
    images: tuple[WorkloadImage, ...] = ()


@dataclass(frozen=True)
class Workload:
    name: str
    prompts: tuple[Prompt, ...]
    source: str

    @property
    def images(self) -> int:
        """How many images the prompts carry, all together (0: a text workload)."""
        return sum(len(p.images) for p in self.prompts)

    def take(self, n: int) -> list[Prompt]:
        """`n` requests, cycling through the prompts in order."""
        return [self.prompts[i % len(self.prompts)] for i in range(n)]


def load_workload(name_or_path: str, *, builtin_dir: Path = BUILTIN_DIR) -> Workload:
    if name_or_path in BUILTIN:
        path = builtin_dir / f"{name_or_path}.jsonl"
        name = name_or_path
    else:
        path = Path(name_or_path)
        name = path.stem
    if not path.is_file():
        raise WorkloadError(
            f"no workload {name_or_path!r}: choose {', '.join(BUILTIN)} or give a .jsonl file"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise WorkloadError(f"{path.name} is not UTF-8 text") from None
    except OSError as e:
        raise WorkloadError(f"cannot read {path.name}: {e.strerror or e}") from None
    images: dict[Path, WorkloadImage] = {}  # a picture used by several lines is read once
    prompts = [
        _parse_line(line, path.name, n, base=path.parent, images=images)
        for n, line in enumerate(text.splitlines(), 1)
        if line.strip()
    ]
    if not prompts:
        raise WorkloadError(f"{path.name} has no prompts")
    # Built-in sets are named by their place in the source tree, not this machine's path.
    source = f"resources/workloads/{name}.jsonl" if name_or_path in BUILTIN else str(path)
    return Workload(name=name, prompts=tuple(prompts), source=source)


def _parse_line(
    line: str, fname: str, n: int, *, base: Path, images: dict[Path, WorkloadImage]
) -> Prompt:
    where = f"{fname} line {n}"
    try:
        obj: Any = json.loads(line)
    except ValueError:
        raise WorkloadError(f"{where}: not valid JSON") from None
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where}: expected a JSON object")
    if "messages" in obj:
        raw = obj["messages"]
        if not isinstance(raw, list) or not raw:
            raise WorkloadError(f"{where}: 'messages' must be a non-empty list")
        messages = []
        for m in raw:
            if (
                not isinstance(m, dict)
                or m.get("role") not in _ROLES
                or not isinstance(m.get("content"), str)
            ):
                raise WorkloadError(
                    f"{where}: each message needs a role (system/user/assistant) and text content"
                )
            messages.append({"role": str(m["role"]), "content": str(m["content"])})
    elif isinstance(obj.get("prompt"), str) and obj["prompt"].strip():
        messages = [{"role": "user", "content": obj["prompt"]}]
    else:
        raise WorkloadError(f"{where}: needs 'messages' or a non-empty 'prompt'")
    max_tokens = obj.get("max_tokens", DEFAULT_MAX_TOKENS)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise WorkloadError(f"{where}: 'max_tokens' must be a whole number of at least 1")
    pictures = _images(obj.get("images", []), where, base, images)
    markers = sum(m["content"].count(MARKER) for m in messages)
    if pictures and markers == 0:
        messages = _place_markers(messages, len(pictures), where)
    elif markers != len(pictures):
        raise WorkloadError(
            f"{where}: the text has {markers} {MARKER} marker(s) for {len(pictures)} image(s)"
        )
    return Prompt(
        id=str(obj.get("id", f"{fname}:{n}")),
        messages=tuple(messages),
        max_tokens=max_tokens,
        images=tuple(pictures),
    )


def _images(
    raw: Any, where: str, base: Path, seen: dict[Path, WorkloadImage]
) -> list[WorkloadImage]:
    if not isinstance(raw, list) or not all(isinstance(x, str) and x.strip() for x in raw):
        raise WorkloadError(f"{where}: 'images' must be a list of image file paths")
    out = []
    for ref in raw:
        path = (base / ref).resolve()
        if path not in seen:
            seen[path] = _read_image(path, ref, where)
        out.append(seen[path])
    return out


def _read_image(path: Path, ref: str, where: str) -> WorkloadImage:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise WorkloadError(f"{where}: no image file {ref}") from None
    except OSError as e:
        raise WorkloadError(f"{where}: cannot read {ref}: {e.strerror or e}") from None
    try:
        px = decode_image(data, ref)
    except MediaError as e:
        raise WorkloadError(f"{where}: {e}") from None
    from PIL import Image  # the format only: decode_image has read the pixels

    with Image.open(io.BytesIO(data)) as im:
        mime = _MIME.get(str(im.format), "image/png")
    return WorkloadImage(path=path, data=data, mime=mime, width=px.width, height=px.height)


def _place_markers(messages: list[dict[str, str]], n: int, where: str) -> list[dict[str, str]]:
    """The markers of `n` images at the start of the first user message."""
    for i, m in enumerate(messages):
        if m["role"] == "user":
            out = list(messages)
            out[i] = {**m, "content": MARKER * n + "\n" + m["content"]}
            return out
    raise WorkloadError(f"{where}: images need a user message to go in")
