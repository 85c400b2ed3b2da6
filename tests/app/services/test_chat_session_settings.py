"""A chat's typed settings against the JSON the chat store keeps: what earlier versions wrote
opens, what is written is what was stored (no Qt here)."""

from __future__ import annotations

from app.services.chat_settings import (
    UNSET,
    ChatSettings,
    EngineBinding,
    SamplingOverrides,
)
from engine.settings import SamplingParams

STORED = {
    "system_prompt": "Be brief.",
    "temperature": 0.2,
    "seed": None,
    "max_tokens": 64,
    "context_policy": "stop",
    "structured_output": {"type": "object", "properties": {"a": {"type": "string"}}},
    "tools_off": ["files"],
    "tool_rounds": 2,
    "tool_choice": "required",
    "collections": ["keeping"],
    "docs_k": 2,
    "docs_budget": 40,
    "docs_reranker": "/models/rerank.gguf",
    "engine": {"connection": "work", "model": "gpt"},
    "from_a_newer_version": [1, 2],
}


def test_the_stored_settings_round_trip() -> None:
    s = ChatSettings.from_stored(STORED)
    assert s.system_prompt == "Be brief." and s.context_policy == "stop"
    assert s.sampling == SamplingOverrides(temperature=0.2, seed=None, max_tokens=64)
    assert s.tools_off == ("files",) and s.tool_rounds == 2 and s.tool_choice == "required"
    assert s.collections == ("keeping",) and (s.docs_k, s.docs_budget) == (2, 40)
    assert s.engine == EngineBinding("work", "gpt")
    assert s.to_stored() == STORED


def test_defaults_are_not_stored_and_follow_the_app() -> None:
    assert ChatSettings().to_stored() == {}
    assert ChatSettings.from_stored({}) == ChatSettings()
    base = SamplingParams(temperature=0.5, seed=7)
    assert ChatSettings().sampling_over(base) == base
    s = ChatSettings.from_stored({"seed": None, "top_k": 3})
    assert s.sampling_over(base) == SamplingParams(temperature=0.5, seed=None, top_k=3)
    assert ChatSettings.from_stored({"top_k": 3}).sampling.seed is UNSET


def test_malformed_values_fall_back_to_their_defaults() -> None:
    s = ChatSettings.from_stored(
        {
            "temperature": "hot",
            "top_k": True,
            "context_policy": "whatever",
            "structured_output": "[]",
            "collections": "keeping",
            "docs_k": 0,
            "tool_rounds": -1,
            "engine": {"connection": ""},
        }
    )
    assert s.sampling == SamplingOverrides()
    assert s.context_policy == "drop_oldest" and s.structured_output is None
    assert s.collections == () and s.docs_k == 5 and s.tool_rounds == 8 and s.engine is None
    # An engine stored as null (the local model, as earlier versions wrote it).
    assert ChatSettings.from_stored({"engine": None}).to_stored() == {}
