"""A chat's settings, declared once and typed: system prompt, sampling, context policy,
structured output, tools, documents and the engine the chat is bound to.

The chat store keeps them as a JSON object in the conversation (and presets the same way):
`from_stored` reads what any version wrote (a malformed value falls back to its default, a
key this version does not know is kept and written back), `to_stored` writes only what
differs from the defaults, so a chat without changes follows the app's defaults.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, cast, get_args

from engine.host.context_policy import ContextPolicy
from engine.settings import SamplingParams

# The stored keys of the settings the UI and other modules name.
SYSTEM_PROMPT_KEY: Final = "system_prompt"
CONTEXT_POLICY_KEY: Final = "context_policy"
STRUCTURED_KEY: Final = "structured_output"  # a JSON schema the answers follow
TOOLS_OFF_KEY: Final = "tools_off"  # MCP servers this chat turned off for itself
TOOL_ROUNDS_KEY: Final = "tool_rounds"
TOOL_CHOICE_KEY: Final = "tool_choice"  # "required", or a tool forced by name
COLLECTIONS_KEY: Final = "collections"  # the collections answers are grounded in
DOCS_K_KEY: Final = "docs_k"  # passages searched for
DOCS_BUDGET_KEY: Final = "docs_budget"  # the share of the context they may take, in percent
DOCS_RERANKER_KEY: Final = "docs_reranker"  # the reranker's file path (absent: none)
ENGINE_KEY: Final = "engine"  # {"connection": name, "model": id}; absent: the local model
AUTO_READ_KEY: Final = "auto_read"  # answers read aloud as they stream

DEFAULT_POLICY: Final[ContextPolicy] = "drop_oldest"
DEFAULT_TOOL_ROUNDS: Final = 8  # tool rounds an answer may take unless the chat says otherwise
DEFAULT_DOCS_K: Final = 5
DEFAULT_DOCS_BUDGET: Final = 25

# The sampling a chat may set for itself (stop strings and grammars are not the drawer's).
SAMPLING_FIELDS: Final = tuple(
    f.name for f in dataclasses.fields(SamplingParams) if f.name not in ("stop", "grammar")
)
_SAMPLING_TYPES: Final[dict[str, tuple[type, ...]]] = {
    f.name: (float, int) if f.default.__class__ is float else (f.default.__class__,)
    for f in dataclasses.fields(SamplingParams)
    if f.name in SAMPLING_FIELDS and f.name != "seed"
}


class Unset(enum.Enum):
    """A seed the chat does not set (None is a setting of its own: a random seed)."""

    UNSET = "unset"


UNSET: Final = Unset.UNSET


@dataclass(frozen=True)
class EngineBinding:
    """A remote engine the chat is bound to: a saved connection and one of its models ('':
    the first one it lists)."""

    connection: str
    model: str = ""

    def to_stored(self) -> dict[str, str]:
        return {"connection": self.connection, "model": self.model}

    @classmethod
    def from_stored(cls, value: object) -> EngineBinding | None:
        """A stored binding; anything malformed is the local model (None)."""
        if not isinstance(value, Mapping):
            return None
        conn = value.get("connection")
        if not isinstance(conn, str) or not conn:
            return None
        return cls(conn, str(value.get("model") or ""))


@dataclass(frozen=True)
class SamplingOverrides:
    """The sampling values a chat sets (None: the app's default; for the seed, UNSET)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    max_tokens: int | None = None
    special_text: bool | None = None
    seed: int | Unset | None = UNSET

    def items(self) -> dict[str, Any]:
        """The values set, by SamplingParams field."""
        out: dict[str, Any] = {}
        for name in SAMPLING_FIELDS:
            value = getattr(self, name)
            if value is not (UNSET if name == "seed" else None):
                out[name] = value
        return out

    def apply(self, base: SamplingParams) -> SamplingParams:
        return dataclasses.replace(base, **self.items())


@dataclass(frozen=True)
class ChatSettings:
    system_prompt: str = ""
    sampling: SamplingOverrides = field(default_factory=SamplingOverrides)
    # What happens when the conversation outgrows the context (engine.host.context_policy).
    context_policy: ContextPolicy = DEFAULT_POLICY
    structured_output: Mapping[str, Any] | None = None  # a JSON schema; None: free text
    tools_off: tuple[str, ...] = ()
    tool_rounds: int = DEFAULT_TOOL_ROUNDS
    tool_choice: str | Mapping[str, Any] | None = None  # None: the model chooses ("auto")
    collections: tuple[str, ...] = ()
    docs_k: int = DEFAULT_DOCS_K
    docs_budget: int = DEFAULT_DOCS_BUDGET  # percent of the context
    docs_reranker: str | None = None
    engine: EngineBinding | None = None
    auto_read: bool = False  # read each answer aloud as it streams (app/services/read_aloud)
    # Keys this version does not know (written by a newer one, or by hand): kept as they are.
    extra: Mapping[str, Any] = field(default_factory=dict)

    def with_engine(self, engine: EngineBinding | None) -> ChatSettings:
        return dataclasses.replace(self, engine=engine)

    def replace(self, **changes: Any) -> ChatSettings:
        return dataclasses.replace(self, **changes)

    def sampling_over(self, base: SamplingParams) -> SamplingParams:
        """`base` (the app's sampling) with this chat's values."""
        return self.sampling.apply(base)

    @property
    def schema(self) -> dict[str, Any] | None:
        return dict(self.structured_output) if self.structured_output is not None else None

    # -- the stored JSON -------------------------------------------------------------------

    @classmethod
    def from_stored(cls, stored: Mapping[str, Any] | None) -> ChatSettings:
        """The settings in a conversation's (or preset's) stored object. Never raises: an
        imported chat may hold anything there."""
        s = dict(stored or {})
        known = {
            SYSTEM_PROMPT_KEY,
            CONTEXT_POLICY_KEY,
            STRUCTURED_KEY,
            TOOLS_OFF_KEY,
            TOOL_ROUNDS_KEY,
            TOOL_CHOICE_KEY,
            COLLECTIONS_KEY,
            DOCS_K_KEY,
            DOCS_BUDGET_KEY,
            DOCS_RERANKER_KEY,
            ENGINE_KEY,
            AUTO_READ_KEY,
            *SAMPLING_FIELDS,
        }
        policy = s.get(CONTEXT_POLICY_KEY)
        schema = s.get(STRUCTURED_KEY)
        choice = s.get(TOOL_CHOICE_KEY)
        reranker = s.get(DOCS_RERANKER_KEY)
        return cls(
            system_prompt=str(s.get(SYSTEM_PROMPT_KEY) or ""),
            sampling=_sampling(s),
            context_policy=cast(ContextPolicy, policy)
            if policy in get_args(ContextPolicy)
            else DEFAULT_POLICY,
            structured_output=dict(schema) if isinstance(schema, dict) else None,
            tools_off=_names(s.get(TOOLS_OFF_KEY), keep_empty=True),
            tool_rounds=_positive(s.get(TOOL_ROUNDS_KEY), DEFAULT_TOOL_ROUNDS),
            tool_choice=choice if isinstance(choice, str | dict) and choice else None,
            collections=_names(s.get(COLLECTIONS_KEY)),
            docs_k=_positive(s.get(DOCS_K_KEY), DEFAULT_DOCS_K),
            docs_budget=_positive(s.get(DOCS_BUDGET_KEY), DEFAULT_DOCS_BUDGET),
            docs_reranker=reranker if isinstance(reranker, str) and reranker else None,
            engine=EngineBinding.from_stored(s.get(ENGINE_KEY)),
            auto_read=s.get(AUTO_READ_KEY) is True,
            extra={k: v for k, v in s.items() if k not in known},
        )

    def to_stored(self) -> dict[str, Any]:
        """The JSON object the store keeps: what differs from the defaults."""
        out: dict[str, Any] = dict(self.extra)
        out.update(self.sampling.items())
        if self.system_prompt:
            out[SYSTEM_PROMPT_KEY] = self.system_prompt
        if self.context_policy != DEFAULT_POLICY:
            out[CONTEXT_POLICY_KEY] = self.context_policy
        if self.structured_output is not None:
            out[STRUCTURED_KEY] = dict(self.structured_output)
        if self.tools_off:
            out[TOOLS_OFF_KEY] = list(self.tools_off)
        if self.tool_rounds != DEFAULT_TOOL_ROUNDS:
            out[TOOL_ROUNDS_KEY] = self.tool_rounds
        if self.tool_choice is not None:
            out[TOOL_CHOICE_KEY] = (
                self.tool_choice if isinstance(self.tool_choice, str) else dict(self.tool_choice)
            )
        if self.collections:
            out[COLLECTIONS_KEY] = list(self.collections)
        if self.docs_k != DEFAULT_DOCS_K:
            out[DOCS_K_KEY] = self.docs_k
        if self.docs_budget != DEFAULT_DOCS_BUDGET:
            out[DOCS_BUDGET_KEY] = self.docs_budget
        if self.docs_reranker is not None:
            out[DOCS_RERANKER_KEY] = self.docs_reranker
        if self.engine is not None:
            out[ENGINE_KEY] = self.engine.to_stored()
        if self.auto_read:
            out[AUTO_READ_KEY] = True
        return out


def _sampling(s: Mapping[str, Any]) -> SamplingOverrides:
    values: dict[str, Any] = {}
    for name, types in _SAMPLING_TYPES.items():
        v = s.get(name)
        if isinstance(v, types) and not (isinstance(v, bool) and bool not in types):
            values[name] = float(cast(float, v)) if float in types else v
    if "seed" in s:
        seed = s["seed"]
        if seed is None or (isinstance(seed, int) and not isinstance(seed, bool)):
            values["seed"] = seed
    return SamplingOverrides(**values)


def _names(value: object, *, keep_empty: bool = False) -> tuple[str, ...]:
    """Distinct names, in order (an imported chat may hold anything there)."""
    if not isinstance(value, list | tuple):
        return ()
    if keep_empty:
        return tuple(dict.fromkeys(str(n) for n in value))
    return tuple(dict.fromkeys(n for n in value if isinstance(n, str) and n))


def _positive(value: object, default: int) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return value if ok else default  # type: ignore[return-value]


__all__ = [
    "AUTO_READ_KEY",
    "COLLECTIONS_KEY",
    "DEFAULT_DOCS_BUDGET",
    "DEFAULT_DOCS_K",
    "DEFAULT_TOOL_ROUNDS",
    "DOCS_BUDGET_KEY",
    "DOCS_K_KEY",
    "DOCS_RERANKER_KEY",
    "STRUCTURED_KEY",
    "UNSET",
    "ChatSettings",
    "EngineBinding",
    "SamplingOverrides",
]
