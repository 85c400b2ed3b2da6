"""A created model's recipe applied to a request, as Ollama applies a Modelfile: its system
prompt when the request sends none, its messages first, its parameters under the request's
own options; and its /api/show Modelfile."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.server.errors import ApiError
from engine.server.library_routes import modelfile, recipe_messages, recipe_options
from engine.server.model_store import NamedModel, full_name
from engine.server.protocol.ollama import OllamaOptions

PIRATE = NamedModel(
    "pirate:latest",
    Path("m.gguf"),
    "smollm2",
    "create",
    system="Talk like a pirate.",
    parameters={"temperature": 0.2, "stop": ["Arr", "Yo"]},
    messages=({"role": "user", "content": "Ahoy"}, {"role": "assistant", "content": "Arr!"}),
    license=("MIT",),
)
ASK = [{"role": "user", "content": "Where is the gold?"}]


def test_the_system_prompt_and_first_messages_come_before_the_request() -> None:
    assert recipe_messages(PIRATE, ASK) == [
        {"role": "system", "content": "Talk like a pirate."},
        *PIRATE.messages,
        *ASK,
    ]
    own = [{"role": "system", "content": "Be brief."}, *ASK]
    assert recipe_messages(PIRATE, own) == [own[0], *PIRATE.messages, *ASK]
    copy = NamedModel("copy:latest", Path("m.gguf"), "smollm2", "copy")
    assert recipe_messages(copy, ASK) == ASK and recipe_messages(None, ASK) == ASK


def test_the_parameters_are_defaults_under_the_requests_options() -> None:
    merged = recipe_options(PIRATE, OllamaOptions.model_validate({"temperature": 0.9}))
    assert merged is not None and merged.temperature == 0.9 and merged.stop == ("Arr", "Yo")
    alone = recipe_options(PIRATE, None)
    assert alone is not None and alone.temperature == 0.2
    broken = NamedModel("x:latest", Path("m.gguf"), "m", "create", parameters={"top_k": -1})
    with pytest.raises(ApiError) as e:  # a hand-edited file: a 400 naming the model
        recipe_options(broken, None)
    assert e.value.status == 400 and "'x:latest'" in e.value.message


def test_the_modelfile_shows_the_recipe() -> None:
    text, params = modelfile(PIRATE)
    assert text.splitlines() == [
        "FROM smollm2",
        'SYSTEM """Talk like a pirate."""',
        "PARAMETER temperature 0.2",
        'PARAMETER stop "Arr"',
        'PARAMETER stop "Yo"',
        'MESSAGE user """Ahoy"""',
        'MESSAGE assistant """Arr!"""',
        'LICENSE """MIT"""',
    ]
    assert params == 'temperature 0.2\nstop "Arr"\nstop "Yo"'


def test_names_take_their_tag() -> None:
    assert full_name("mine") == "mine:latest"
    assert full_name("mine:v2") == "mine:v2"
    assert full_name("hf.co/owner/repo") == "hf.co/owner/repo:latest"
    assert full_name("host:5000/team/mine") == "host:5000/team/mine:latest"
