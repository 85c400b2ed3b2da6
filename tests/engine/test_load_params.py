"""LoadParams.validate: settings that can never load are refused in one line before any
llama.cpp call (the CLI's own checks are in tests/app/test_cli_parsing.py)."""

from __future__ import annotations

import pytest

from engine.errors import EngineError
from engine.settings import LoadParams


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (LoadParams(state_cache_mb=-1), "prompt cache's RAM"),
        (LoadParams(n_ubatch=0), "at least 1"),
        (LoadParams(type_v="q8_0", flash_attn="off"), "needs flash attention"),
    ],
)
def test_impossible_settings_are_refused(params: LoadParams, message: str) -> None:
    with pytest.raises(EngineError, match=message):
        params.validate()


def test_the_defaults_and_an_empty_prompt_cache_are_accepted() -> None:
    LoadParams().validate()
    LoadParams(state_cache_mb=0).validate()
