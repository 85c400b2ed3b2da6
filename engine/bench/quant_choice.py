"""Which quant to run, in one sentence: the smallest file whose quality loss (mean KL
divergence from the reference) stays within the user's limit, whose memory estimate fits this
machine, and whose generation speed reaches the user's minimum.

The quality figures are `bench quality`'s (`QualityResult`); the speed and memory of each file
come from the caller (the app's speed records and predictions, the memory estimate), each with
where it came from, so the sentence can say "measured" or "predicted". Nothing here measures.

The reference is a choice too (KL divergence 0 by definition): when no candidate is good
enough but the reference is, the reference is the answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.bench.quality_result import QualityResult

SpeedSource = Literal["measured", "predicted", "unknown"]
CHOICE_KEY = "quant_choice"  # the key the choice is kept under beside a quality result's JSON


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class FileSpeed(_Model):
    """A file's generation (decode) speed on this machine and where the figure comes from."""

    tokens_per_s: float | None = None
    source: SpeedSource = "unknown"
    detail: str = Field(default="", description="what the figure is based on, for a tooltip")


class FileMemory(_Model):
    """A file's memory estimate at the load settings a chat would use."""

    total_bytes: int | None = None
    fits: bool | None = None  # None: not estimated
    verdict_text: str = ""


class QuantOption(_Model):
    """One file as the choice sees it."""

    name: str
    path: str
    quantization: str
    size_bytes: int
    reference: bool = False
    kld_mean: float = Field(description="0 for the reference")
    top1_agreement: float = Field(description="1 for the reference")
    speed: FileSpeed = FileSpeed()
    memory: FileMemory = FileMemory()


class Thresholds(_Model):
    """The user's limits; None: no limit."""

    max_kld: float | None = None
    min_tokens_per_s: float | None = None


class QuantChoice(_Model):
    """The options, the limits and the answer: the chosen file's name or None, one sentence,
    and why each other file was left out."""

    options: list[QuantOption]
    thresholds: Thresholds
    chosen: str | None
    sentence: str
    excluded: dict[str, str] = Field(default_factory=dict)


def options_of(
    result: QualityResult,
    speeds: Mapping[str, FileSpeed] | None = None,
    memory: Mapping[str, FileMemory] | None = None,
) -> list[QuantOption]:
    """The reference and every candidate of `result`, with the speed and memory the caller
    knows for each (keyed by the file's path as the result names it)."""
    speeds, memory = speeds or {}, memory or {}
    ref = result.reference
    opts = [
        QuantOption(
            name=ref.name,
            path=ref.path,
            quantization=ref.quantization,
            size_bytes=ref.size_bytes,
            reference=True,
            kld_mean=0.0,
            top1_agreement=1.0,
            speed=speeds.get(ref.path, FileSpeed()),
            memory=memory.get(ref.path, FileMemory()),
        )
    ]
    opts.extend(
        QuantOption(
            name=c.name,
            path=c.path,
            quantization=c.quantization,
            size_bytes=c.size_bytes,
            kld_mean=c.kld_mean,
            top1_agreement=c.top1_agreement,
            speed=speeds.get(c.path, FileSpeed()),
            memory=memory.get(c.path, FileMemory()),
        )
        for c in result.candidates
    )
    return opts


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB"


def _label(o: QuantOption) -> str:
    return o.name + (" (the reference)" if o.reference else "")


def why_not(o: QuantOption, t: Thresholds) -> str | None:
    """Why `o` is left out under `t`, as a clause; None when it qualifies."""
    if t.max_kld is not None and o.kld_mean > t.max_kld:
        return f"KL divergence {o.kld_mean:.4f} is over {t.max_kld:g}"
    if o.memory.fits is False:
        return f"does not fit in memory ({o.memory.verdict_text or 'estimate'})"
    if t.min_tokens_per_s is not None:
        tps = o.speed.tokens_per_s
        if tps is None:
            return "its speed is not known"
        if tps < t.min_tokens_per_s:
            return f"{tps:.0f} tokens/s ({o.speed.source}) is under {t.min_tokens_per_s:g}"
    return None


def choose(options: Sequence[QuantOption], thresholds: Thresholds) -> QuantChoice:
    """The smallest file that qualifies (ties: the lower KL divergence), with its sentence."""
    excluded = {o.name: r for o in options if (r := why_not(o, thresholds)) is not None}
    good = [o for o in options if o.name not in excluded]
    if not good:
        return QuantChoice(
            options=list(options),
            thresholds=thresholds,
            chosen=None,
            sentence=_why_none(options, excluded),
            excluded=excluded,
        )
    best = min(good, key=lambda o: (o.size_bytes, o.kld_mean))
    return QuantChoice(
        options=list(options),
        thresholds=thresholds,
        chosen=best.name,
        sentence=_why(best, thresholds, len(good)),
        excluded=excluded,
    )


def _why(o: QuantOption, t: Thresholds, n_good: int) -> str:
    parts = []
    if t.max_kld is not None:
        parts.append(f"KL divergence {o.kld_mean:.4f} within {t.max_kld:g}")
    else:
        parts.append(f"KL divergence {o.kld_mean:.4f}")
    if o.memory.fits is True:
        parts.append(f"fits ({o.memory.verdict_text})" if o.memory.verdict_text else "fits")
    elif o.memory.fits is None:
        parts.append("memory not estimated")
    if o.speed.tokens_per_s is not None:
        speed = f"{o.speed.tokens_per_s:.0f} tokens/s {o.speed.source}"
        if t.min_tokens_per_s is not None:
            speed += f", at least {t.min_tokens_per_s:g}"
        parts.append(speed)
    else:
        parts.append("speed not known")
    which = (
        f"the smallest of the {n_good} files that qualify"
        if n_good > 1
        else "the only file that qualifies"
    )
    return f"Run {_label(o)}: {which} ({_mb(o.size_bytes)}; {', '.join(parts)})."


def _why_none(options: Sequence[QuantOption], excluded: Mapping[str, str]) -> str:
    if not options:
        return "No files to choose from."
    reasons = "; ".join(f"{n} {r}" for n, r in excluded.items())
    return f"None of the {len(options)} files qualifies: {reasons}."


def format_choice_table(choice: QuantChoice) -> str:
    """The options with their speed and memory, then the sentence."""
    lines = [
        f"{'file':<34} {'type':<7} {'size':>9} {'KLD mean':>9} {'top-1':>7} "
        f"{'gen t/s':>8} {'speed':<9} {'memory':>9} {'fits':<5} ok"
    ]
    for o in choice.options:
        name = _label(o) if o.reference else o.name
        name = name if len(name) <= 34 else "…" + name[-33:]
        tps = "-" if o.speed.tokens_per_s is None else f"{o.speed.tokens_per_s:.0f}"
        mem = "-" if o.memory.total_bytes is None else _mb(o.memory.total_bytes)
        fits = {True: "yes", False: "no", None: "?"}[o.memory.fits]
        ok = "<- chosen" if o.name == choice.chosen else ("no" if o.name in choice.excluded else "")
        lines.append(
            f"{name:<34} {o.quantization or '?':<7} {_mb(o.size_bytes):>9} "
            f"{o.kld_mean:>9.5f} {100 * o.top1_agreement:>6.2f}% {tps:>8} "
            f"{o.speed.source:<9} {mem:>9} {fits:<5} {ok}"
        )
    lines.append("")
    lines.append(choice.sentence)
    return "\n".join(lines)


__all__ = [
    "CHOICE_KEY",
    "FileMemory",
    "FileSpeed",
    "QuantChoice",
    "QuantOption",
    "SpeedSource",
    "Thresholds",
    "choose",
    "format_choice_table",
    "options_of",
    "why_not",
]
