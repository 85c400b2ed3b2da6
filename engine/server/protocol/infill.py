"""llama-server's native routes for editors: `/infill` (code fill-in-the-middle, as llama.vim
and llama.vscode ask for it) and `/slots/{id}?action=save|restore|erase` (a slot's prompt KV
state kept in a file). The field names and the answers' shapes are llama-server's
(tools/server in llama.cpp); the sampling fields are those the other routes take, under
llama-server's names (`n_predict`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, RootModel

from engine.server.body_model import Body, NotHonoured, refuse
from engine.server.protocol.base import (
    Penalty,
    RepeatPenalty,
    Reply,
    Seed,
    Stop,
    Temperature,
    TopP,
    UnitInterval,
)
from engine.server.protocol.llama import Timings
from engine.server.protocol.llama_utility import SamplingDefaults

MAX_EXTRA_CHUNKS = 256


def _n_predict(v: Any) -> int:
    if type(v) is int and (v == -1 or v >= 1):
        return v
    raise refuse("must be -1 (the server's default) or a number of tokens, 1 or more")


class InfillChunk(Body):
    """One chunk of repository context: another file's text, put before the prefix."""

    text: str
    filename: Annotated[str, Field(description='the file it comes from (default "tmp")')] = "tmp"


class InfillRequest(Body):
    model: str | None = None
    input_prefix: Annotated[str, Field(description="the code before the cursor")]
    input_suffix: Annotated[str, Field(description="the code after the cursor")]
    input_extra: Annotated[
        list[InfillChunk],
        Field(
            max_length=MAX_EXTRA_CHUNKS,
            description="repository context: other files' text, before the prefix",
        ),
    ] = Field(default_factory=list)
    prompt: Annotated[
        str,
        Field(description="the start of the middle, already typed (read after the prefix)"),
    ] = ""
    n_predict: Annotated[
        int,
        BeforeValidator(
            _n_predict, json_schema_input_type=Literal[-1] | Annotated[int, Field(ge=1)]
        ),
        Field(description="tokens to generate; -1: the server's default (capped there)"),
    ] = -1
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    min_p: UnitInterval | None = None
    repeat_penalty: RepeatPenalty | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: Seed | None = None
    stop: Stop = ()
    stream: bool | None = None
    # llama.vim sends these; what they ask for is not done here, so asking is refused.
    n_indent: Annotated[Any, NotHonoured("no indentation stop rule", (0,))] = None
    samplers: Annotated[Any, NotHonoured("the sampler order is the server's")] = None
    t_max_prompt_ms: Annotated[Any, NotHonoured("no time limit per phase")] = None
    t_max_predict_ms: Annotated[Any, NotHonoured("no time limit per phase")] = None
    response_fields: Annotated[Any, NotHonoured("the whole answer is sent")] = None


StopType = Literal["none", "eos", "limit", "word"]


class InfillAnswer(Reply):
    """The whole answer, or a stream's last event (`stop`: true)."""

    index: int
    content: str
    tokens: list[int]
    stop: bool
    model: str
    tokens_predicted: int
    tokens_evaluated: int
    generation_settings: Annotated[
        SamplingDefaults, Field(description="what the request was sampled with")
    ]
    prompt: Annotated[str, Field(description="the prompt as built, special tokens as text")]
    has_new_line: bool
    truncated: bool
    stop_type: StopType
    stopping_word: str
    tokens_cached: int
    timings: Timings


class InfillChunkEvent(Reply):
    """A piece of a streamed answer (`stop`: false)."""

    index: int
    content: str
    tokens: list[int]
    stop: bool
    tokens_predicted: int
    tokens_evaluated: int


class SlotFileRequest(Body):
    """The body of a slot's save and restore."""

    filename: Annotated[
        str,
        Field(
            min_length=1,
            description="a plain file name inside the server's --slot-save-path folder",
        ),
    ]


class SlotSaveTimings(Reply):
    save_ms: float


class SlotRestoreTimings(Reply):
    restore_ms: float


class SlotSaved(Reply):
    id_slot: int
    filename: str
    n_saved: int
    n_written: int
    timings: SlotSaveTimings


class SlotRestored(Reply):
    id_slot: int
    filename: str
    n_restored: int
    n_read: int
    timings: SlotRestoreTimings


class SlotErased(Reply):
    id_slot: int
    n_erased: int


class SlotActionAnswer(RootModel[SlotSaved | SlotRestored | SlotErased]):
    """A slot action's answer: its own shape per action (save, restore, erase)."""


class SlotNextToken(Reply):
    has_next_token: bool  # the request goes on
    has_new_line: bool  # its text so far has a line break
    n_remain: int  # tokens it may still generate
    n_decoded: int  # tokens generated


class SlotState(Reply):
    """One slot in GET /slots, as llama-server's `server_slot::to_json` writes it: the
    request it serves, when it serves one (llama-server also shows a slot's last request;
    here an idle slot shows only its own fields)."""

    id: int
    n_ctx: int
    speculative: bool
    is_processing: bool
    id_task: int | None = None
    n_prompt_tokens: int | None = None
    n_prompt_tokens_processed: int | None = None
    n_prompt_tokens_cache: int | None = None
    params: SamplingDefaults | None = None
    next_token: list[SlotNextToken] | None = None
    prompt: str | None = None
    generated: str | None = None


class SlotList(RootModel[list[SlotState]]):
    """GET /slots: every slot of the model, in order."""
