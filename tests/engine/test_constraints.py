"""Constrained decoding on the real SmolLM2: replies follow their JSON schema or grammar,
whatever the model would rather say; schemas that cannot be enforced are refused by name."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from engine.decoding import constraints
from engine.decoding.constraints import GrammarError
from engine.host.runtime import Model
from engine.settings import LoadParams, SamplingParams

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe a person called Ana as JSON."}]


@pytest.fixture(scope="module")
def model(smollm2_path: Path) -> Iterator[Model]:
    m = Model(smollm2_path, LoadParams(n_ctx=2048, n_seq_max=2, n_threads=2))
    yield m
    m.close()


def reply(model: Model, grammar: str | None, **kw: object) -> tuple[str, str]:
    sampling = SamplingParams(**{"temperature": 0, "max_tokens": 160, "grammar": grammar, **kw})  # type: ignore[arg-type]
    gen = model.generate(ASK, sampling)
    text = gen.consume()
    return text, gen.stats.stop_reason


def test_unconstrained_reply_is_not_json(model: Model) -> None:
    """The premise: left alone, this model answers in prose around a code block."""
    text, _ = reply(model, None)
    with pytest.raises(ValueError):
        json.loads(text)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_schema_reply_validates(model: Model, temperature: float) -> None:
    text, reason = reply(model, constraints.json_schema(PERSON), temperature=temperature, seed=7)
    assert reason == "stop"  # finished by the grammar, not cut by max_tokens
    jsonschema.validate(json.loads(text), PERSON)


def test_any_json_object(model: Model) -> None:
    text, reason = reply(model, constraints.any_json_object())
    assert reason == "stop"
    assert isinstance(json.loads(text), dict)


def test_gbnf_grammar(model: Model) -> None:
    g = constraints.gbnf('root ::= "yes" | "no"')
    text, reason = reply(model, g)
    assert text in ("yes", "no")
    assert reason == "stop"


def test_two_grammars_at_once_keep_their_own_state(model: Model) -> None:
    a = model.generate(
        ASK, SamplingParams(temperature=0, max_tokens=160, grammar=constraints.json_schema(PERSON))
    )
    b = model.generate(
        ASK,
        SamplingParams(temperature=0, max_tokens=40, grammar=constraints.gbnf("root ::= [0-9]{3}")),
    )
    ta, tb = a.consume(), b.consume()
    jsonschema.validate(json.loads(ta), PERSON)
    assert re.fullmatch(r"[0-9]{3}", tb)


def test_speculation_is_off_under_a_grammar(model: Model) -> None:
    gen = model.generate(
        ASK,
        SamplingParams(temperature=0, max_tokens=160, grammar=constraints.json_schema(PERSON)),
        spec="lookup",
    )
    text = gen.consume()
    jsonschema.validate(json.loads(text), PERSON)
    assert gen.stats.draft_tokens == 0


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"type": "object", "not": {"required": ["x"]}}, "not"),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "string"}},
                "dependentSchemas": {"a": {"required": ["b"]}},
            },
            "dependentSchemas",
        ),
        ({"type": "array", "contains": {"type": "integer"}}, "contains"),
    ],
)
def test_unsupported_keyword_is_named(schema: dict[str, object], named: str) -> None:
    with pytest.raises(GrammarError, match=named):
        constraints.json_schema(schema)


def test_not_a_schema() -> None:
    with pytest.raises(GrammarError, match="JSON object"):
        constraints.json_schema([1, 2])
    with pytest.raises(GrammarError, match=r"not valid GBNF|cannot be used"):
        constraints.gbnf("root ::= (")


def test_hostile_schemas_are_bounded(model: Model) -> None:
    deep: dict[str, object] = {"type": "string"}
    for _ in range(10_000):
        deep = {"type": "array", "items": deep}
    with pytest.raises(GrammarError, match="nested"):
        constraints.json_schema(deep)
    with pytest.raises(GrammarError, match="larger than"):
        constraints.json_schema({"enum": [f"value-{i}" for i in range(50_000)]})
    # Recursion through $ref is a grammar like any other: it compiles and decodes.
    tree = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "v": {"type": "integer"},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2},
                },
                "required": ["v", "kids"],
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/node",
    }
    text, _ = reply(model, constraints.json_schema(tree), max_tokens=120)
    if text.endswith("}"):
        jsonschema.validate(json.loads(text), tree)
    # A combinatorial schema hits llguidance's limits and is refused, not compiled for long.
    props = {
        f"p{i}": {
            "anyOf": [
                {"type": "string", "pattern": f"^(a|b){{{i},}}x[0-9]{{40}}$"},
                {"type": "integer"},
            ]
        }
        for i in range(200)
    }
    try:
        g = constraints.json_schema({"type": "object", "properties": props})
    except GrammarError as e:
        assert "cannot be used" in str(e)
    else:
        model.grammar_mask(g)  # compiled within the limits: usable


@pytest.mark.parametrize("special_text", [False, True])
def test_control_tokens_in_the_reply_text(model: Model, special_text: bool) -> None:
    """Tool-call markers can be control tokens: a request that parses them gets their text."""
    marker = "<|im_start|>"
    tok = model.special_token(marker)
    assert tok is not None and model.special_token("hello") is None
    g = constraints.lark(f'start: <[{tok}]> "yes"')
    text, _ = reply(model, g, special_text=special_text)
    assert text == (marker + "yes" if special_text else "yes")
