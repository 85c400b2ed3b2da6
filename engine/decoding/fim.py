"""The prompt of a fill-in-the-middle request, token for token as llama-server builds it
(`format_prompt_infill` in llama.cpp's tools/server/server-common.cpp), so an editor plugin
written for llama-server gets the same completion here.

The repo-level layout (Qwen2.5-Coder's, arXiv 2409.12186):

    [extra chunks][BOS][FIM_PRE]prefix prompt[FIM_SUF]suffix[FIM_MID]

where the extra chunks are `[FIM_REP]myproject\\n` (when the vocabulary has FIM_REP), then per
chunk `[FIM_SEP]filename\\n` + its text (without FIM_SEP: a "--- snippet ---" line), then
`[FIM_SEP]filename\\n` for the file being edited. With `spm` (llama-server's --spm-infill) the
suffix part comes first: `[FIM_SUF]suffix[FIM_PRE]prefix prompt[FIM_MID]`. BOS sits after the
extra chunks, where llama-server puts it.

Budgets, llama-server's: the prefix keeps its last 3/4 of a batch of tokens, the suffix its
first `n_batch/4 - 2 - len(prompt)`, and the extra chunks the last `n_ctx - n_batch -
2*n_predict` tokens of theirs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

NULL = -1  # LLAMA_TOKEN_NULL: the vocabulary has no such token

# llama-server's separator of extra chunks when there is no FIM_SEP token.
SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"
PROJECT_LINE = "myproject\n"  # llama-server names no project (a TODO there)
CURRENT_FILE_LINE = "filename\n"  # nor the current file


@dataclass(frozen=True)
class FimTokens:
    """A vocabulary's fill-in-the-middle markers (`llama_vocab_fim_*`: the GGUF's
    tokenizer.ggml.fim_*_token_id, or what llama.cpp recognised by their text); NULL: none."""

    pre: int = NULL
    suf: int = NULL
    mid: int = NULL
    pad: int = NULL
    rep: int = NULL
    sep: int = NULL

    def missing(self) -> list[str]:
        """Which of the three markers an infill needs the vocabulary lacks, in llama-server's
        words."""
        return [
            f"{what} token is missing"
            for what, tok in (("prefix", self.pre), ("suffix", self.suf), ("middle", self.mid))
            if tok == NULL
        ]


@dataclass(frozen=True)
class InfillInput:
    prefix: str
    suffix: str
    extra: Sequence[tuple[str, str]]  # (filename, text)
    prompt: str


# text -> tokens, without BOS/EOS; `special`: control tokens written as text are parsed.
Tokenize = Callable[[str, bool], list[int]]


def infill_prompt(
    tokenize: Tokenize,
    fim: FimTokens,
    data: InfillInput,
    *,
    n_batch: int,
    n_ctx: int,
    n_predict: int,
    bos: int | None,
    spm: bool = False,
) -> list[int]:
    """The tokens llama-server decodes for `data`. `bos`: the vocabulary's BOS when it adds one
    (`llama_vocab_get_add_bos`), else None. `n_ctx`: a slot's context; `n_predict`: the
    server's default number of tokens to generate (not the request's: llama-server's)."""
    extra: list[int] = []
    if fim.rep != NULL:
        extra += [fim.rep, *tokenize(PROJECT_LINE, False)]
    for filename, text in data.extra:
        if fim.sep != NULL:
            extra += [fim.sep, *tokenize(filename + "\n", False)]
        else:
            extra += tokenize(SNIPPET_SEPARATOR, False)
        extra += tokenize(text, False)
    if fim.sep != NULL:
        extra += [fim.sep, *tokenize(CURRENT_FILE_LINE, False)]

    prefix = tokenize(data.prefix, False)
    suffix = tokenize(data.suffix, False)
    prompt = tokenize(data.prompt, True)  # llama-server parses the prompt's special tokens
    n_prefix = min(len(prefix), 3 * (n_batch // 4))
    n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra))

    head = [fim.pre, *prefix[len(prefix) - n_prefix :], *prompt]
    tail = [fim.suf, *suffix[:n_suffix]]
    first, second = (tail, head) if spm else (head, tail)
    out = extra[len(extra) - n_extra :]
    if bos is not None:
        out.append(bos)
    return [*out, *first, *second, fim.mid]


__all__ = ["NULL", "FimTokens", "InfillInput", "Tokenize", "infill_prompt"]
