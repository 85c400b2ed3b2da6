"""Compare quants, as the Benchmark page runs it: which library files are quants of the same
model as a reference, the candidates asked to be made first (`models quantize`), the quality
pass (`engine.bench.quality`), each file's speed and memory (`quant_facts`) and the choice
(`engine.bench.quant_choice`); the last comparison kept in one JSON file, the same shape as
`bench quality --out` with `--max-kld`/`--min-speed` writes, so `bench compare` reads it.

Qt-free and blocking: the window runs `run_comparison` on its own thread.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from app.services.atomic_write import write_text_atomic
from app.services.library import LibraryEntry, ModelLibrary
from app.services.local_quants import default_output, entry_for, quantize_model
from app.services.quant_facts import facts_of
from app.services.speed_records import SpeedService
from engine.bench.quality import QualitySetup, run_quality, scoring_load_params
from engine.bench.quality_result import QualityResult
from engine.bench.quality_text import builtin_text
from engine.bench.quant_choice import (
    CHOICE_KEY,
    QuantChoice,
    Thresholds,
    choose,
    options_of,
)
from engine.bench.result import BenchError
from engine.host.runtime import Model
from engine.model.gguf import GGUFError, read_gguf
from engine.model.quant_types import parse_quant_type
from engine.native.load_probe import FirstLoads

# What the caller hears: a phase ("making Q4_0", "reference", "candidate X.gguf", "speed and
# memory") with steps done and in all.
CompareProgress = Callable[[str, int, int], None]


def family_mismatch(reference: Path, other: Path) -> str | None:
    """Why `other` is not a quant of the same model as `reference` (architecture, tensor
    count or names differ), or None when it is."""
    try:
        a, b = read_gguf(reference), read_gguf(other)
    except (GGUFError, OSError) as e:
        return f"{other.name} cannot be read: {e}"
    if a.architecture != b.architecture:
        return f"{other.name} is a {b.architecture or '?'} model, the reference {a.architecture}"
    if len(a.tensors) != len(b.tensors):
        return f"{other.name} has {len(b.tensors)} tensors, the reference {len(a.tensors)}"
    # The order of the table may differ (llama-quantize writes it in its own order).
    if sorted(t.name for t in a.tensors) != sorted(t.name for t in b.tensors):
        return f"{other.name} names its tensors differently from the reference"
    return None


def same_family(library: ModelLibrary, reference: LibraryEntry) -> list[LibraryEntry]:
    """The library's other files that are quants of the same model as `reference`."""
    out = []
    for e in library.entries():
        other = e.error is None and e.id != reference.id and e.path != reference.path
        if other and family_mismatch(reference.path, e.path) is None:
            out.append(e)
    return out


# What makes two files quants of one model: `family_mismatch`'s checks as one value.
Family = tuple[str, tuple[str, ...]]


@dataclass(frozen=True)
class ScannedFile:
    """A readable library file, its size, and its family."""

    entry: LibraryEntry
    size: int
    family: Family


@dataclass(frozen=True)
class LibraryScan:
    """The library as the Compare quants tab lists it, read off the GUI thread: every
    readable file once (its header, its size), so picking another reference reads nothing."""

    files: tuple[ScannedFile, ...] = ()
    error: str | None = None  # the library could not be listed

    def references(self) -> list[ScannedFile]:
        """By name, the largest (highest-precision) file of a name first."""
        return sorted(self.files, key=lambda f: (f.entry.name.lower(), -f.size))

    def get(self, entry_id: str) -> ScannedFile | None:
        return next((f for f in self.files if f.entry.id == entry_id), None)

    def family(self, entry_id: str) -> list[ScannedFile]:
        """The other files that are quants of the same model as `entry_id` (`same_family`)."""
        ref = self.get(entry_id)
        if ref is None:
            return []
        return [
            f
            for f in self.files
            if f.family == ref.family
            and f.entry.id != ref.entry.id
            and f.entry.path != ref.entry.path
        ]


def scan_library(library: ModelLibrary) -> LibraryScan:
    """Every readable library file with its size and family: one header read a file (slow on
    a slow disk: the window calls it on the Compare quants thread)."""
    try:
        entries = [e for e in library.entries() if e.error is None]
    except OSError as err:
        return LibraryScan(error=f"The library could not be read: {err.strerror or err}")
    files = []
    for e in entries:
        try:
            size = e.path.stat().st_size
            gf = read_gguf(e.path)
        except (GGUFError, OSError):
            continue  # gone or broken since the library listed it
        family = (gf.architecture, tuple(sorted(t.name for t in gf.tensors)))
        files.append(ScannedFile(e, size, family))
    return LibraryScan(tuple(files))


@dataclass(frozen=True)
class CompareJob:
    """What to compare: a reference, library candidates, types to make from the reference,
    and the text's chunking (the built-in corpus)."""

    reference: str  # a library id or a path
    candidates: Sequence[str] = ()
    make: Sequence[str] = ()
    ctx: int = 512
    max_chunks: int | None = 8
    thresholds: Thresholds = field(default_factory=Thresholds)


@dataclass(frozen=True)
class Comparison:
    """A quality result and the choice over its files (with their speed and memory)."""

    result: QualityResult
    choice: QuantChoice

    def rechoose(self, thresholds: Thresholds) -> Comparison:
        return Comparison(self.result, choose(self.choice.options, thresholds))

    def to_dict(self) -> dict[str, object]:
        return {**self.result.to_dict(), CHOICE_KEY: self.choice.model_dump(mode="json")}

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(self.to_dict(), indent=1, ensure_ascii=False) + "\n")

    @classmethod
    def load(cls, path: Path) -> Comparison:
        """BenchError when the file is not a comparison (a quality result without a choice
        is not one: it has no speed or memory)."""
        result = QualityResult.load(path)
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data.get(CHOICE_KEY), dict):
            raise BenchError(f"{path.name} has no quant choice")
        try:
            choice = QuantChoice.model_validate(data[CHOICE_KEY])
        except ValueError:
            raise BenchError(f"{path.name}: its quant choice cannot be read") from None
        return cls(result, choice)


def run_comparison(
    job: CompareJob,
    library: ModelLibrary,
    speed: SpeedService,
    cache_dir: Path,
    *,
    progress: CompareProgress | None = None,
    cancel: threading.Event | None = None,
    threads: int | None = None,
    first_loads: FirstLoads | None = None,
) -> Comparison:
    """Make the asked quants (into the library, beside their source or in its folder), score
    every candidate against the reference, and choose under `job.thresholds`. `first_loads`:
    a file never loaded before is tried in a child process first (a file that crashes
    llama.cpp must not take the app with it)."""

    def tell(phase: str, done: int, total: int) -> None:
        if progress is not None:
            progress(phase, done, total)

    reference = library.resolve(job.reference)
    candidates = [library.resolve(c) for c in job.candidates]
    made: dict[Path, str] = {}
    for name in job.make:
        qtype = parse_quant_type(name)
        target = default_output(library, reference, qtype, entry_for(library, reference))
        if target.is_file() and family_mismatch(reference, target) is None:
            made[target] = qtype.name  # made by an earlier comparison: kept in the library
            continue
        phase = f"making {qtype.name}"

        def made_tensors(done: int, total: int, phase: str = phase) -> None:
            tell(phase, done, total)

        q = quantize_model(
            library,
            str(reference),
            qtype,
            allow_requantize=True,
            progress=made_tensors,
            cancel=cancel,
        )
        made[q.result.output] = q.result.qtype
    for p in candidates:
        if (why := family_mismatch(reference, p)) is not None:
            raise BenchError(why)
    params = scoring_load_params(threads)
    setup = QualitySetup(ctx=job.ctx, max_chunks=job.max_chunks, cache_dir=cache_dir, made=made)
    result = run_quality(
        reference,
        [*candidates, *(p for p in made if p not in candidates)],
        builtin_text(),
        setup,
        load=lambda path: Model(path, params, first_loads=first_loads),
        progress=tell,
        cancel=cancel,
    )
    tell("speed and memory", 0, 1)
    speeds, memory = facts_of(result, speed)
    tell("speed and memory", 1, 1)
    return Comparison(result, choose(options_of(result, speeds, memory), job.thresholds))


__all__ = [
    "CompareJob",
    "CompareProgress",
    "Comparison",
    "LibraryScan",
    "ScannedFile",
    "family_mismatch",
    "run_comparison",
    "same_family",
    "scan_library",
]
