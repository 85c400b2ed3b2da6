"""Tool calls: how each model family is shown tools and how its answers carry calls.

A model calls a tool by writing text in the format its chat template taught it; one module a
family: `hermes` (`<tool_call>` JSON blocks), `llama3` (a JSON answer, maybe after
`<|python_tag|>`), `mistral` (`[TOOL_CALLS]` and a JSON list), and `generic` for every other
template (llama-server's generic handler: the tools described in the system message, every
answer JSON, which a grammar enforces). `family` picks one from the template's text.

A `ToolFormat` (`base`) turns OpenAI-shaped history into what the family's template expects
(`history`), gives the constraint that forces a call (a llguidance Lark grammar, bounded:
`schema`) and splits answers into content and calls, whole (`parse`) or while they stream
(`ToolCallStream`), with the readers the families share (`reading`). A call that does not
parse stays in the content: the user sees what the model wrote rather than an error. A forced
answer that the token limit cut is still calls, never text (`cut_calls`): the last one marked
incomplete.

A reasoning model may draft a call in its think block: that is never a call. The reply reader
(engine.decoding.reply_reader) finds the block; where it leaves the block in the text, it tells
the format where the answer starts (`start`), and nothing before it is read for calls.
"""

from engine.decoding.tool_calls.base import ToolCallStream, ToolFormat
from engine.decoding.tool_calls.calls import (
    MAX_ARGUMENT_CHARS,
    MAX_PARALLEL_CALLS,
    ToolCall,
    ToolCallError,
    ToolChoice,
    new_call_id,
)
from engine.decoding.tool_calls.family import tool_format_for
from engine.decoding.tool_calls.generic import GenericFormat, generic_tools_prompt
from engine.decoding.tool_calls.hermes import HermesFormat
from engine.decoding.tool_calls.llama3 import Llama3JsonFormat
from engine.decoding.tool_calls.mistral import MistralFormat

__all__ = [
    "MAX_ARGUMENT_CHARS",
    "MAX_PARALLEL_CALLS",
    "GenericFormat",
    "HermesFormat",
    "Llama3JsonFormat",
    "MistralFormat",
    "ToolCall",
    "ToolCallError",
    "ToolCallStream",
    "ToolChoice",
    "ToolFormat",
    "generic_tools_prompt",
    "new_call_id",
    "tool_format_for",
]
