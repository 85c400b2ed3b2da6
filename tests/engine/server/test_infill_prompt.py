"""The /infill prompt, token for token, against llama-server's rules (`format_prompt_infill` in
llama.cpp's tools/server/server-common.cpp), each case's layout written out by hand from them:

    [FIM_REP]myproject\\n ([FIM_SEP]name\\n text)* [FIM_SEP]filename\\n    <- the extra context
    [BOS] [FIM_PRE] prefix prompt [FIM_SUF] suffix [FIM_MID]

(without FIM_SEP a chunk starts with "\\n\\n--- snippet ---\\n\\n" and no current-file line
follows; --spm-infill swaps the two middle parts). The prefix keeps its last 3*(n_batch/4)
tokens, the suffix its first n_batch/4 - 2 - len(prompt), the extra context its last
n_ctx - n_batch - 2*n_predict. The tokenizer here is one token per character, so each case's
tokens can be read off its text; the prompt alone is read with special tokens parsed ("<S>" is
one token there, as llama-server tokenizes `prompt`). The real model's prompt is checked through
the server in test_infill_api.py."""

from __future__ import annotations

from engine.decoding.fim import NULL, FimTokens, InfillInput, infill_prompt

PRE, SUF, MID, PAD, REP, SEP, BOS = 1, 2, 3, 4, 5, 6, 7
SPECIAL = 99  # "<S>" in a text read with special tokens parsed
FULL = FimTokens(pre=PRE, suf=SUF, mid=MID, pad=PAD, rep=REP, sep=SEP)
BARE = FimTokens(pre=PRE, suf=SUF, mid=MID)  # no repository tokens


def t(text: str) -> list[int]:
    """The expected tokens of `text` read without special tokens: one per character."""
    return [ord(c) for c in text]


def tokenize(text: str, special: bool) -> list[int]:
    out: list[int] = []
    i = 0
    while i < len(text):
        if special and text.startswith("<S>", i):
            out.append(SPECIAL)
            i += 3
        else:
            out.append(ord(text[i]))
            i += 1
    return out


def build(
    fim: FimTokens,
    prefix: str = "ab",
    suffix: str = "cd",
    prompt: str = "",
    extra: tuple[tuple[str, str], ...] = (),
    *,
    n_batch: int = 64,
    n_ctx: int = 1024,
    n_predict: int = 16,
    bos: int | None = None,
    spm: bool = False,
) -> list[int]:
    return infill_prompt(
        tokenize,
        fim,
        InfillInput(prefix, suffix, extra, prompt),
        n_batch=n_batch,
        n_ctx=n_ctx,
        n_predict=n_predict,
        bos=bos,
        spm=spm,
    )


REPO = [REP, *t("myproject\n")]
CURRENT = [SEP, *t("filename\n")]


def test_the_plain_layout_with_a_repository_vocabulary() -> None:
    got = build(FULL, "def f(", "):\n", "x")
    assert got == [*REPO, *CURRENT, PRE, *t("def f(x"), SUF, *t("):\n"), MID]


def test_bos_goes_after_the_extra_context_before_the_prefix_marker() -> None:
    got = build(FULL, "a", "b", bos=BOS)
    assert got == [*REPO, *CURRENT, BOS, PRE, *t("a"), SUF, *t("b"), MID]


def test_extra_chunks_each_under_their_file_name() -> None:
    got = build(FULL, "p", "s", extra=(("x.py", "X = 1\n"), ("y.py", "Y")))
    assert got == [
        *REPO,
        SEP,
        *t("x.py\n"),
        *t("X = 1\n"),
        SEP,
        *t("y.py\n"),
        *t("Y"),
        *CURRENT,
        PRE,
        *t("p"),
        SUF,
        *t("s"),
        MID,
    ]


def test_without_repository_tokens_chunks_are_snippets_and_no_file_line() -> None:
    got = build(BARE, "p", "s", extra=(("x.py", "X"),))
    assert got == [*t("\n\n--- snippet ---\n\n"), *t("X"), PRE, *t("p"), SUF, *t("s"), MID]
    assert build(BARE, "p", "s") == [PRE, *t("p"), SUF, *t("s"), MID]


def test_spm_puts_the_suffix_first() -> None:
    got = build(BARE, "ab", "cd", "e", bos=BOS, spm=True)
    assert got == [BOS, SUF, *t("cd"), PRE, *t("abe"), MID]


def test_the_prompt_alone_is_read_with_special_tokens() -> None:
    got = build(BARE, "<S>", "<S>", "<S>")
    assert got == [PRE, *t("<S>"), SPECIAL, SUF, *t("<S>"), MID]


def test_prefix_keeps_its_end_and_suffix_its_start_within_a_batch() -> None:
    prefix, suffix = "0123456789abcdefghij", "ABCDEFGHIJ"
    # n_batch 16: the prefix keeps its last 3*(16/4) = 12, the suffix its first 16/4 - 2 = 2.
    assert build(BARE, prefix, suffix, n_batch=16) == [
        PRE,
        *t("89abcdefghij"),
        SUF,
        *t("AB"),
        MID,
    ]
    # A prompt of one token leaves the suffix 4 - 2 - 1 = 1; of two, none. The prompt is
    # never cut.
    assert build(BARE, prefix, suffix, "x", n_batch=16) == [
        PRE,
        *t("89abcdefghijx"),
        SUF,
        *t("A"),
        MID,
    ]
    assert build(BARE, prefix, suffix, "xyz", n_batch=16) == [
        PRE,
        *t("89abcdefghijxyz"),
        SUF,
        MID,
    ]


def test_the_extra_context_keeps_its_last_tokens_within_the_context() -> None:
    extra = (("f", "0123456789"),)
    whole = [*REPO, SEP, *t("f\n"), *t("0123456789"), *CURRENT]
    # n_ctx 16 + 2*4 + 5: room for the last 5 tokens of the extra context, the end of its
    # current-file line.
    got = build(FULL, "p", "s", extra=extra, n_batch=16, n_ctx=29, n_predict=4)
    assert got == [*whole[-5:], PRE, *t("p"), SUF, *t("s"), MID]
    assert whole[-5:] == t("name\n")
    # No room at all: none of it; room for more than there is: all of it.
    got = build(FULL, "p", "s", extra=extra, n_batch=16, n_ctx=20, n_predict=4)
    assert got == [PRE, *t("p"), SUF, *t("s"), MID]
    got = build(FULL, "p", "s", extra=extra, n_batch=16, n_ctx=4096, n_predict=4)
    assert got == [*whole, PRE, *t("p"), SUF, *t("s"), MID]


def test_missing_markers_are_named() -> None:
    assert FimTokens(rep=REP).missing() == [
        "prefix token is missing",
        "suffix token is missing",
        "middle token is missing",
    ]
    assert FimTokens(pre=PRE, suf=SUF).missing() == ["middle token is missing"]
    assert FULL.missing() == []
    assert NULL == -1
