"""Constrained decoding: what a reply must match (a JSON schema, any JSON object, a GBNF or
Lark grammar), compiled by llguidance into a per-request matcher that masks the logits
before every sample.

Why llguidance rather than llama.cpp's grammar sampler with the JSON-schema converter that
llama-cpp-python ships (both measured on the same schemas, docs/benchmarks.md "Structured
output"): the converter ignores the keywords it cannot express (`not`, `minimum`,
`uniqueItems`...) without a word, so an answer could look valid and not be; its string rule
lets raw control characters into JSON strings, which no JSON parser accepts; llguidance names
every keyword it cannot honour, bounds the work of every compile and every token
(`LIMITS`), and computes a 49k-token mask in about 0.1 ms.

One engine for every grammar: GBNF (llama-server's `grammar` field) is translated by
llguidance's own GBNF-to-Lark converter.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Iterable, Mapping
from typing import Any

import llguidance
import numpy as np
import numpy.typing as npt
from llguidance.gbnf_to_lark import any_to_lark

from engine.errors import EngineError

# What one grammar may cost. The defaults (500k symbols, 1M lexer fuel) let a hostile schema
# keep a compile busy for a second or more with the GIL released: the decode thread would wait.
LIMITS_KW: dict[str, Any] = {
    "max_grammar_size": 200_000,
    "initial_lexer_fuel": 400_000,
    "step_lexer_fuel": 200_000,
    "max_lexer_states": 100_000,
    "verbose_errors": False,  # errors reach HTTP clients: no parser dumps
}
MAX_SCHEMA_CHARS = 200_000  # as JSON text
MAX_SCHEMA_DEPTH = 64  # nesting of the schema document itself
MAX_GRAMMAR_CHARS = 200_000


class GrammarError(EngineError):
    """A schema or grammar that cannot constrain decoding; `str()` names what and why."""


def limits() -> llguidance.LLParserLimits:
    return llguidance.LLParserLimits(**LIMITS_KW)


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a JSON document, giving up past `limit` (no recursion: a hostile
    schema nested 100k deep must not take the stack)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if d > deepest:
            deepest = d
            if deepest > limit:
                return deepest
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return deepest


def json_schema(schema: Any, *, what: str = "the schema") -> str:
    """The grammar of answers valid against `schema` (a JSON-schema object). Keywords that
    llguidance cannot enforce are refused by name, never ignored."""
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    if not isinstance(schema, Mapping):
        raise GrammarError(f"{what} must be a JSON object")
    if _depth(schema, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        raise GrammarError(f"{what} is nested more than {MAX_SCHEMA_DEPTH} levels deep")
    try:
        text = json.dumps(schema)
    except (TypeError, ValueError) as e:
        raise GrammarError(f"{what} is not JSON: {e}") from None
    if len(text) > MAX_SCHEMA_CHARS:
        raise GrammarError(f"{what} is larger than {MAX_SCHEMA_CHARS} characters")
    try:
        # Compact separators, no free whitespace: a small model given the choice can emit
        # newlines until max_tokens; the answer is parsed, not read.
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            text, defaults={"whitespace_flexible": False}
        )
    except ValueError as e:
        raise GrammarError(f"{what} is not valid: {_first_line(e)}") from None
    check(grammar, what)
    return grammar


def any_json_object() -> str:
    """OpenAI's `json_object` and Ollama's `format: "json"`: some JSON object."""
    return json_schema({"type": "object"}, what="the JSON format")


def gbnf(text: str) -> str:
    """llama.cpp's GBNF, as llama-server's `grammar` field takes it."""
    if not isinstance(text, str) or not text.strip():
        raise GrammarError("the grammar is empty")
    if len(text) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"the grammar is longer than {MAX_GRAMMAR_CHARS} characters")
    try:
        lark_text = any_to_lark(text)
    except Exception as e:  # the converter raises plain exceptions on syntax errors
        raise GrammarError(f"the grammar is not valid GBNF: {_first_line(e)}") from None
    return lark(lark_text, what="the grammar")


def lark(text: str, *, what: str = "the grammar") -> str:
    """A Lark grammar (llguidance's dialect, which embeds JSON schemas with `%json{...}`)."""
    if len(text) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"{what} is longer than {MAX_GRAMMAR_CHARS} characters")
    grammar = llguidance.LLMatcher.grammar_from_lark(text)
    check(grammar, what)
    return grammar


def check(
    grammar: str, what: str = "the grammar", tokenizer: llguidance.LLTokenizer | None = None
) -> None:
    error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer, limits=limits())
    if error:
        raise GrammarError(f"{what} cannot be used: {_first_line(error)}")


def _first_line(e: object) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def tokenizer_for(
    C: Any, vocab: Any, n_vocab: int, eog_tokens: Iterable[int]
) -> llguidance.LLTokenizer:
    """llguidance's view of a llama.cpp vocabulary (about 0.3 s for 49k tokens: build once
    per model). Every end-of-generation token counts as the end of the answer.

    As llguidance's own `llamacpp.lltokenizer_from_vocab`, on the current vocabulary calls
    (that helper still uses ones this llama-cpp-python deprecates): control tokens, and
    user-defined ones that look like them, are marked with a 0xFF prefix so that grammars
    can name them as special tokens."""
    size = 16 * 1024
    buf = ctypes.create_string_buffer(size + 1)
    special = C.LLAMA_TOKEN_ATTR_CONTROL
    user = C.LLAMA_TOKEN_ATTR_USER_DEFINED
    tokens: list[bytes] = []
    for tok in range(n_vocab):
        n = C.llama_token_to_piece(vocab, tok, buf, size, 0, True)
        piece = buf.raw[:n] if n > 0 else b""
        attr = int(C.llama_vocab_get_attr(vocab, tok))
        if attr & special or (attr & user and piece.startswith(b"<") and piece.endswith(b">")):
            piece = b"\xff" + piece
        tokens.append(piece)
    tokenize = ctypes.cast(C._lib.llama_tokenize, ctypes.c_void_p).value
    return llguidance.LLTokenizer.from_llamacpp(  # type: ignore[attr-defined,no-any-return]
        tokens=tokens,
        vocab_ptr=vocab,
        tokenize_fptr=tokenize,
        eos_token=list(eog_tokens),
        slices=None,
    )


class TokenMask:
    """One request's grammar state: masks the logits row before sampling and follows the
    tokens sampled. Lives on the decode thread once submitted."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, grammar: str, n_vocab: int) -> None:
        self._matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0, limits=limits())
        if self._matcher.is_error():
            raise GrammarError(
                f"the grammar cannot be used: {_first_line(self._matcher.get_error())}"
            )
        self._n_vocab = n_vocab
        self._words: npt.NDArray[np.int32] = np.zeros((n_vocab + 31) // 32, dtype=np.int32)

    def apply(self, logits: npt.NDArray[np.float32]) -> None:
        """Set every token the grammar does not allow next to -inf, in place."""
        self._matcher.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
        allowed = np.unpackbits(self._words.view(np.uint8), count=self._n_vocab, bitorder="little")
        np.putmask(logits, allowed == 0, -np.inf)

    def consume(self, token: int) -> bool:
        """Follow a sampled token; False if the grammar refused it (then it is in error)."""
        return bool(self._matcher.consume_token(token))

    @property
    def complete(self) -> bool:
        """The answer matches and nothing more may follow: end it now."""
        return bool(self._matcher.is_stopped())

    @property
    def error(self) -> str | None:
        return self._matcher.get_error() if self._matcher.is_error() else None
