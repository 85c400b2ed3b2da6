"""Benchmark workloads: prompt sets in JSONL, one request per line.

A line is `{"messages": [{"role": ..., "content": ...}, ...], "max_tokens": N, "id": "..."}`;
`{"prompt": "..."}` is accepted as a single user message. `max_tokens` is the realistic output
length of that prompt (the benchmark may cap it). The shipped sets live in
resources/workloads/ and are chosen by name: chat, rag, code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BUILTIN_DIR = Path(__file__).resolve().parents[2] / "resources" / "workloads"
BUILTIN = ("chat", "rag", "code")
DEFAULT_MAX_TOKENS = 256
_ROLES = frozenset({"system", "user", "assistant"})


class WorkloadError(ValueError):
    """A workload file that cannot be used; `str()` is one line naming the file and line."""


@dataclass(frozen=True)
class Prompt:
    id: str
    messages: tuple[dict[str, str], ...]
    max_tokens: int


@dataclass(frozen=True)
class Workload:
    name: str
    prompts: tuple[Prompt, ...]
    source: str

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
    prompts = [
        _parse_line(line, path.name, n)
        for n, line in enumerate(text.splitlines(), 1)
        if line.strip()
    ]
    if not prompts:
        raise WorkloadError(f"{path.name} has no prompts")
    # Built-in sets are named by their place in the source tree, not this machine's path.
    source = f"resources/workloads/{name}.jsonl" if name_or_path in BUILTIN else str(path)
    return Workload(name=name, prompts=tuple(prompts), source=source)


def _parse_line(line: str, fname: str, n: int) -> Prompt:
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
    return Prompt(
        id=str(obj.get("id", f"{fname}:{n}")), messages=tuple(messages), max_tokens=max_tokens
    )
