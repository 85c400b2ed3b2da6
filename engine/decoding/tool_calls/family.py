"""Which family a chat template belongs to, from its text."""

from __future__ import annotations

import re

from engine.decoding.tool_calls.base import ToolFormat
from engine.decoding.tool_calls.generic import GenericFormat
from engine.decoding.tool_calls.hermes import HermesFormat
from engine.decoding.tool_calls.llama3 import Llama3JsonFormat
from engine.decoding.tool_calls.mistral import MistralFormat

_USES_TOOLS = re.compile(r"\btools\b")

_HERMES_CALL = re.compile(r'\{\\?"name\\?":')

# <tool_call> wrapping XML rather than JSON: Qwen3-Coder, GLM, MiniMax...
_XML_CALLS = ("<function=", "<arg_key>", "<invoke ")

_LLAMA3_HEADER = "<|start_header_id|>"


def tool_format_for(template_source: str | None) -> ToolFormat:
    """Pick the family from the template text (e.g. '<tool_call>' → hermes; Llama 3.x headers +
    tools/'<|python_tag|>' or '"parameters"' → llama3_json; '[TOOL_CALLS]' → mistral; a
    template that never references `tools` (or None) → generic)."""
    src = template_source or ""
    if not _USES_TOOLS.search(src) or any(m in src for m in _XML_CALLS):
        return GenericFormat(system_role=not _refuses_system(src))
    if "[TOOL_CALLS]" in src and "[ARGS]" not in src:  # [ARGS]: Mistral's later name[ARGS]{}
        return MistralFormat()
    if "<tool_call>" in src and "<tool_calls>" not in src and _HERMES_CALL.search(src):
        return HermesFormat()
    if _LLAMA3_HEADER in src and ("<|python_tag|>" in src or '"parameters"' in src):
        return Llama3JsonFormat()
    return GenericFormat(system_role=not _refuses_system(src))


def _refuses_system(src: str) -> bool:
    # Gemma's wording; such templates raise on a system turn, so the tools go to the user.
    return "system role not supported" in src.lower()
