"""llama-server's extensions of the OpenAI chat dialect, in its shapes (its tools/server
README and server-task.cpp): the `timings` an answer carries, the `prompt_progress` of a
stream, the request fields its web UI sends with every chat, and its error object
(`{"error": {"code", "message", "type"}}`, the code a number). Its own utility routes'
bodies and answers are in `llama_utility`.

`openai` imports this module, so nothing here imports `openai`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from engine.host.stats import GenerationStats
from engine.server.body_model import Body, NotHonoured, refuse
from engine.server.protocol.base import Reply


class Timings(Reply):
    """What llama-server reports of a request's speed (`server_slot_stats::to_json`): the
    prompt tokens read from the cache and processed, the tokens predicted, and the time in
    the decodes that carried them. Its rates are its own formulas: 1000 * n / ms and
    ms / n."""

    cache_n: int
    prompt_n: int
    prompt_ms: float
    prompt_per_token_ms: float
    prompt_per_second: float
    predicted_n: int
    predicted_ms: float
    predicted_per_token_ms: float
    predicted_per_second: float
    draft_n: int | None = None  # speculative decoding: tokens drafted...
    draft_n_accepted: int | None = None  # ...and accepted

    @classmethod
    def of(cls, st: GenerationStats, predicted_n: int | None = None) -> Timings:
        """The timings of `st`; `predicted_n`: the tokens generated so far, for a request
        still running (its stats' counts then lag the events by a step at most)."""
        n_gen = st.gen_tokens if predicted_n is None else predicted_n
        out = cls(
            cache_n=st.cached_tokens,
            prompt_n=st.n_prompt_eval,
            prompt_ms=st.prompt_eval_ms,
            prompt_per_token_ms=_per_token(st.prompt_eval_ms, st.n_prompt_eval),
            prompt_per_second=_per_second(st.n_prompt_eval, st.prompt_eval_ms),
            predicted_n=n_gen,
            predicted_ms=st.eval_ms,
            predicted_per_token_ms=_per_token(st.eval_ms, n_gen),
            predicted_per_second=_per_second(n_gen, st.eval_ms),
        )
        if st.draft_tokens:
            out.draft_n = st.draft_tokens
            out.draft_n_accepted = st.draft_accepted
        return out


def _per_token(ms: float, n: int) -> float:
    return ms / n if n else 0.0


def _per_second(n: int, ms: float) -> float:
    return 1000.0 * n / ms if ms > 0 else 0.0


class PromptProgress(Reply):
    """How far the prompt has been read (llama-server's `return_progress`): its tokens in
    all, those taken from the cache, those in the KV cells so far, and the time since the
    request got its slot."""

    total: int
    cache: int
    processed: int
    time_ms: int


class LlamaChatFields(Body):
    """The fields llama-server's web UI sends with every chat request: honoured, or (its
    `backend_sampling: true`) refused by name."""

    timings_per_token: Annotated[
        bool | None,
        Field(description="llama-server's: every streamed chunk carries the `timings` so far"),
    ] = None
    return_progress: Annotated[
        bool | None,
        Field(
            description="llama-server's: a streamed answer reports `prompt_progress` when the "
            "request gets its slot and when its prompt has been read"
        ),
    ] = None
    sse_ping_interval: Annotated[
        int | None,
        Field(
            ge=-1,
            le=2**31 - 1,
            description="llama-server's: a stream silent this many seconds sends an SSE "
            "comment (`:`) to keep the connection; 0 or -1: none",
        ),
    ] = None
    backend_sampling: Annotated[
        Any,
        NotHonoured("sampling runs in the decode loop, on the CPU", (False,)),
    ] = None


# The names a template is given by the server itself: a request sets them through its own
# fields (messages, tools), never through `chat_template_kwargs`.
RESERVED_TEMPLATE_NAMES = frozenset(
    {
        "messages",
        "add_generation_prompt",
        "bos_token",
        "eos_token",
        "tools",
        "raise_exception",
        "strftime_now",
    }
)


def _template_kwargs(v: Any) -> Any:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise refuse("must be an object of the chat template's variables")
    for key, value in v.items():
        if not key.isidentifier():
            raise refuse(f"has {key!r}, which is not a template variable's name")
        if key in RESERVED_TEMPLATE_NAMES:
            raise refuse(f"cannot set {key!r}: the server gives the template that itself")
        if key == "enable_thinking" and not isinstance(value, bool):
            raise refuse("'enable_thinking' must be true or false")
    return v


class TemplateKwargsField(Body):
    """llama-server's `chat_template_kwargs`: more variables for the model's chat template
    (Qwen3's `enable_thinking`), on chat requests and /apply-template."""

    chat_template_kwargs: Annotated[
        dict[str, Any] | None,
        BeforeValidator(_template_kwargs),
        Field(
            description="variables passed to the model's chat template (llama-server's), "
            'e.g. {"enable_thinking": false}; names the server sets itself (messages, '
            "tools, add_generation_prompt, bos_token, eos_token) are refused"
        ),
    ] = None


Budget = Annotated[int, Field(ge=-1, le=2**31 - 1)]


class ReasoningBudgetFields(Body):
    """llama-server's reasoning budget of one chat request (its server-common.cpp)."""

    reasoning_budget_tokens: Annotated[
        Budget | None,
        Field(
            description="llama-server's: the thinking's tokens at most, then the block is "
            "closed and the answer follows; 0 no thinking, -1 the server's --reasoning-budget"
        ),
    ] = None
    thinking_budget_tokens: Annotated[
        Budget | None, Field(description="llama-server's other name of reasoning_budget_tokens")
    ] = None
    reasoning_budget_message: Annotated[
        str | None,
        Field(description="llama-server's: written before the close the budget forces"),
    ] = None

    def asked_budget(self) -> int | None:
        """The request's own budget (None: the server's)."""
        n = self.reasoning_budget_tokens
        n = self.thinking_budget_tokens if n is None else n
        return None if n is None or n < 0 else n


class LlamaErrorDetail(Reply):
    code: int  # the HTTP status
    message: str
    type: str


class LlamaError(Reply):
    """llama-server's error answer (`format_error_response`); its 404 for a route it does
    not have is this shape too."""

    error: LlamaErrorDetail


__all__ = [
    "LlamaChatFields",
    "LlamaError",
    "LlamaErrorDetail",
    "PromptProgress",
    "Timings",
]
