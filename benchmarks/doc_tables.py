"""Generated tables in the docs: a benchmark's `--write` replaces the text between two markers."""

from __future__ import annotations

from pathlib import Path


def replace_between(doc: Path, start: str, end: str, text: str) -> None:
    page = doc.read_text("utf-8")
    head, rest = page.split(start, 1)
    _, tail = rest.split(end, 1)
    doc.write_text(f"{head}{start}\n{text}\n{end}{tail}", "utf-8")
