"""What drafting buys on this model and machine, measured while the loop runs.

Whether one batch that verifies k drafted tokens beats k + 1 one-token steps depends on the
CPU's kernels for the weights' types, the threads and the other slots sharing the batch: a
verified position cost ~0.55 of a decode on the 2-core EPYC, ~0.17 on an AMX Xeon
(docs/speculative.md). So the loop measures it instead of assuming it:

- the verification cost curve (`MeasuredCost`): each lone step's decode time by its size, over
  a one-token decode's; prompt lookup sizes its drafts with it. The kernel table's curve
  (`engine.host.speculative.VerifyCost`) stands in for a size until it has been seen. Each
  figure is the median of the last `WINDOW` ratios, each taken against the one-token decode
  of its time: a decode another program preempted (one 1 s step among 5 ms ones) moves
  neither, and a busy spell that slows every size alike leaves the ratios as they were. A
  ratio counts for `MAX_AGE` one-token decodes: else a curve measured on a bad spell, which
  makes every draft a loss, would never be measured again (only drafts are).
- the gain (`DraftGain`): per concurrency level (how many slots generate in the step) and kind
  of draft (`bucket`: prompt lookup's match strength), the time per token produced by steps
  with drafts and by steps without. A kind of draft is used while its steps produce tokens
  faster than plain steps (exploit); every `explore_every`th chance goes the other way
  (explore), so a change (a longer context, a busier machine) is seen. A step where the
  drafter found nothing is a plain step: lookup that finds nothing costs only the lookup.

Sums decay with every step observed, so the figures follow the machine; a step that took more
than `OUTLIER` times its kind's time per token counts as that much (a preempted step would
otherwise outweigh a hundred others). Everything here runs on the decode thread.
"""

from __future__ import annotations

import statistics
import weakref
from collections import deque
from dataclasses import dataclass, field

from engine.host.speculative import CostCurve, Drafter, PromptLookup

# Steps of a kind measured before its figure is trusted over exploring it.
MIN_STEPS = 4
EXPLORE_EVERY = 16
DECAY = 0.97  # per observation: about the last 30 steps of each kind count
WINDOW = 8  # decode-time ratios of a size the cost curve keeps (their median counts)
MAX_AGE = 256  # one-token decodes after which a ratio no longer counts
AGE_STEP = 16  # ... checked every this many (the curve is not recomputed every step)
OUTLIER = 4.0  # a step counts at most this many times its kind's time per token


@dataclass
class Rate:
    """Decayed sums of tokens produced and seconds spent, and how many steps were added."""

    tokens: float = 0.0
    seconds: float = 0.0
    steps: int = 0

    def add(self, tokens: float, seconds: float, decay: float = DECAY) -> None:
        typical = self.per_token if self.steps >= MIN_STEPS else None
        if typical is not None:
            seconds = min(seconds, OUTLIER * typical * tokens)
        self.tokens = self.tokens * decay + tokens
        self.seconds = self.seconds * decay + seconds
        self.steps += 1

    @property
    def per_token(self) -> float | None:
        return self.seconds / self.tokens if self.tokens > 0 and self.steps else None


class MeasuredCost:
    """A decode of n tokens in units of a one-token decode, from lone steps' decode times.
    Each n-token decode is divided by the median of the recent one-token decodes when it
    happens; a size's figure is the median of its last WINDOW such ratios not older than
    MAX_AGE one-token decodes. A size with fewer than MIN_STEPS of them follows `prior`'s
    shape, shifted by what the measured sizes beside it showed against the prior: between two
    of them by the smaller of their shifts, before the first and past the last by that one's;
    `prior` itself while no size is measured.

    Why the prior's shape, and the smaller shift: the column kernels' curve bends (two to four
    tokens cheap, each from five dear). A line through the measured 2, 5 and 6 tokens, as this
    read them before, put 4 tokens at 1.7 decodes where they cost 1.5 (2-core EPYC), so lookup
    drafted five tokens where three paid more, never measured 4 again and stayed there
    (`speculative.py`: x1.22 that run; x1.30-1.31 with this rule and `COST_COLUMNS`' bend).
    A size that looks dear is never drafted, so never measured: where two measured sizes
    disagree, the cheaper reading is the one that lets it be tried. A busy machine, where
    every size is dear, stays dear."""

    def __init__(self, prior: CostCurve) -> None:
        self.prior = prior
        self._unit: deque[float] = deque(maxlen=WINDOW)  # one-token decodes, seconds
        self._unit_seen = 0
        # By size: (self._unit_seen when measured, ratio), the last WINDOW.
        self._ratios: dict[int, deque[tuple[int, float]]] = {}
        # The measured sizes' figures, kept until a ratio comes or may have expired:
        # draft_len reads a size per draft length a step, plain steps bring one-token decodes.
        self._seen: dict[int, float] | None = None

    def observe(self, n: int, seconds: float) -> None:
        if n <= 1:
            self._unit.append(seconds)
            self._unit_seen += 1
            if self._unit_seen == MIN_STEPS or self._unit_seen % AGE_STEP == 0:
                self._seen = None
        elif self._unit:  # (before any one-token decode there is nothing to compare with)
            ratio = seconds / statistics.median(self._unit)
            self._ratios.setdefault(n, deque(maxlen=WINDOW)).append((self._unit_seen, ratio))
            self._seen = None

    def measured(self, n: int) -> float | None:
        if self._unit_seen < MIN_STEPS:
            return None
        if n <= 1:
            return 1.0
        oldest = self._unit_seen - MAX_AGE
        got = [r for at, r in self._ratios.get(n, ()) if at >= oldest]
        return statistics.median(got) if len(got) >= MIN_STEPS else None

    def __call__(self, n: int) -> float:
        if n <= 1:
            return 1.0
        seen = self._seen
        if seen is None:
            seen = self._seen = {m: c for m in self._ratios if (c := self.measured(m)) is not None}
        got = seen.get(n)
        if got is not None:
            return got
        if not seen:
            return self.prior(n)
        below = max((m for m in seen if m < n), default=None)
        above = min((m for m in seen if m > n), default=None)
        beside = [m for m in (below, above) if m is not None]
        shift = min(seen[m] - self.prior(m) for m in beside)
        return max(1.0, self.prior(n) + shift)


@dataclass
class Level:
    """What one concurrency level measured: plain steps, drafted steps by kind, all steps."""

    plain: Rate = field(default_factory=Rate)
    drafted: dict[int, Rate] = field(default_factory=dict)
    every: Rate = field(default_factory=Rate)
    chances: dict[int, int] = field(default_factory=dict)


class DraftGain:
    """One loop's measurements (see the module doc). `allow` before drafting, `observe` after
    every step of generating slots at least one of which may draft."""

    def __init__(self, prior: CostCurve, *, explore_every: int = EXPLORE_EVERY) -> None:
        self.curve = MeasuredCost(prior)
        self.explore_every = explore_every
        self._levels: dict[int, Level] = {}

    def level(self, busy: int) -> Level:
        return self._levels.setdefault(busy, Level())

    def allow(self, busy: int, bucket: int) -> bool:
        """Whether a draft of this kind goes into a step with `busy` generating slots."""
        lv = self.level(busy)
        n = lv.chances[bucket] = lv.chances.get(bucket, 0) + 1
        drafted = lv.drafted.get(bucket)
        if drafted is None or drafted.steps < MIN_STEPS:
            return True  # not measured yet: try it
        if lv.plain.steps < MIN_STEPS:
            return n % 2 == 0  # every step drafted so far: measure plain ones too
        p, d = lv.plain.per_token, drafted.per_token
        wins = p is not None and d is not None and d < p
        return wins != (n % self.explore_every == 0)

    def observe(self, busy: int, produced: int, seconds: float, bucket: int | None) -> None:
        """A step of `busy` generating slots gave `produced` tokens in `seconds`; `bucket`:
        the kind of draft it verified, None for a step without drafts."""
        if produced <= 0 or seconds <= 0:
            return
        lv = self.level(busy)
        if bucket is None:
            lv.plain.add(produced, seconds)
        else:
            lv.drafted.setdefault(bucket, Rate()).add(produced, seconds)
        lv.every.add(produced, seconds)

    def gain(self, busy: int = 1) -> float | None:
        """Tokens per second of the drafting requests' steps over plain steps' at this
        level: what drafting bought there (1.0: nothing; None: not measured)."""
        lv = self._levels.get(busy)
        if lv is None or lv.plain.steps < MIN_STEPS or not lv.drafted:
            return None
        p, e = lv.plain.per_token, lv.every.per_token
        return None if p is None or not e else p / e

    def gains(self) -> dict[int, float]:
        """The measured gain per concurrency level (levels not measured left out)."""
        out = {}
        for busy in sorted(self._levels):
            g = self.gain(busy)
            if g is not None:
                out[busy] = round(g, 3)
        return out


def bucket(drafter: Drafter) -> int:
    """The kind of the drafter's last proposal: for prompt lookup, how strongly the match was
    backed (a 2-token coincidence, 3-7, 8-15, 16 or more agreeing tokens); one kind else."""
    if not isinstance(drafter, PromptLookup):
        return 0
    a = drafter.last_match
    return 0 if a < 3 else 1 if a < 8 else 2 if a < 16 else 3


_BY_OBJECT: weakref.WeakKeyDictionary[object, DraftGain] = weakref.WeakKeyDictionary()
_BY_FILE: dict[tuple[str, str], DraftGain] = {}
_FILES_KEPT = 16


def gains_for(model: object, prior: CostCurve) -> DraftGain:
    """The model's measurements. They belong to the weights, the load settings and this
    machine, so they are kept across the model's contexts (a server's lease recreates the
    context) and, for a model file, across loads of it with the same settings in this
    process (the last `_FILES_KEPT` of them); a model without a file keeps its own."""
    path = getattr(model, "path", None)
    if path is None:
        g = _BY_OBJECT.get(model)
        if g is None:
            g = _BY_OBJECT[model] = DraftGain(prior)
        return g
    key = (str(path), repr(getattr(model, "params", None)))
    g = _BY_FILE.pop(key, None) or DraftGain(prior)
    _BY_FILE[key] = g  # most recently used last
    while len(_BY_FILE) > _FILES_KEPT:
        del _BY_FILE[next(iter(_BY_FILE))]
    return g


__all__ = [
    "AGE_STEP",
    "DECAY",
    "EXPLORE_EVERY",
    "MAX_AGE",
    "MIN_STEPS",
    "OUTLIER",
    "WINDOW",
    "DraftGain",
    "Level",
    "MeasuredCost",
    "Rate",
    "bucket",
    "gains_for",
]
