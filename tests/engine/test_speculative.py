"""Speculative decoding on the real SmolLM2: same greedy output, clean KV cache, vocab checks."""

from __future__ import annotations

import threading
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from engine.errors import EngineError
from engine.host.runtime import Model
from engine.host.speculative import (
    COST_AMX,
    COST_CPU,
    DraftModel,
    PromptLookup,
    Speculator,
    VerifyCost,
    check_vocab,
    draft_model_source,
    load_draft_model,
    lookup_source,
    spec_stats,
    verify_cost,
)
from engine.model.gguf import GGUFError
from engine.native import llama_lib
from engine.settings import LoadParams, SamplingParams, SpeculativeSettings
from tests.exactness import assert_same_greedy

# Short prompts and answers (under 64 and 256 tokens): where `Model.exactness` covers them,
# greedy output must match plain decoding token for token (tests/exactness.py).
QUOTE = [{"role": "user", "content":
          "The quick brown fox jumps over the lazy dog. The early bird catches the worm. "
          "Repeat both sentences exactly, then repeat them again."}]
FREE = [{"role": "user", "content": "Write a short list of three fruits and their colors."}]
# Drafts copy text the repeat penalty would discourage: these tests measure drafting alone.
GREEDY = SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=32)


def exact_params(**kw: Any) -> LoadParams:
    """Load settings where drafting can give plain decoding's tokens: no extra buffers."""
    return LoadParams(extra_buffers=False, **kw)


def same(m: Model, got: list[int], ref: list[int], *, positions: int = 255,
         batch: int = 63) -> None:
    assert_same_greedy(m.exactness, got, ref, positions=positions, batch=batch)


@pytest.fixture(scope="module")
def smollm2(exact_smollm2_path: Path) -> Iterator[Model]:
    """SmolLM2's batch-invariant twin with flash attention on and no extra buffers: where
    llama.cpp's CPU kernels give the same logits for a token decoded alone or inside a
    verification batch (at short contexts), which exactness needs (docs/speculative.md)."""
    model = Model(exact_smollm2_path, exact_params(n_ctx=2048, n_threads=1, flash_attn="on"))
    yield model
    model.close()


def kv_end(model: Model) -> int:
    """Highest position in sequence 0 of the KV cache (-1 when empty)."""
    return int(model._lib.llama_memory_seq_pos_max(model._memory, 0))


def flash_line(model: Model) -> str:
    """What llama.cpp says it did with flash attention when it created the context."""
    line = next(x for x in model.load_info.log if "flash_attn " in x and "=" in x)
    return line.split("=", 1)[1].strip()


def assert_kv_clean(model: Model) -> None:
    assert kv_end(model) == len(model._cached) - 1


@pytest.fixture(scope="module")
def self_draft(exact_smollm2_path: Path) -> Iterator[Model]:
    """SmolLM2 as its own draft model: drafts always right, the strictest correctness check."""
    draft = Model(exact_smollm2_path,
                  exact_params(n_ctx=1024, n_threads=1, state_cache_mb=0, flash_attn="on"))
    yield draft
    draft.close()


def plain(model: Model, messages: list[dict[str, str]], s: SamplingParams) -> list[int]:
    model.reset_cache()
    gen = model.generate(messages, s)
    gen.consume()
    assert_kv_clean(model)
    return gen.tokens


def test_prompt_lookup_greedy_identical(smollm2: Model) -> None:
    for messages in (QUOTE, FREE):
        ref = plain(smollm2, messages, GREEDY)
        smollm2.reset_cache()
        gen = smollm2.generate(messages, GREEDY, token_source=lookup_source())
        text = gen.consume()
        same(smollm2, gen.tokens, ref)
        assert text == smollm2.detokenize(gen.tokens)
        assert gen.stats.gen_tokens == len(ref)
        assert gen.stats.draft_accepted <= gen.stats.draft_tokens
        assert_kv_clean(smollm2)
        if messages is QUOTE:
            # The quoting prompt is where lookup shines: most of its drafts are right.
            assert gen.stats.draft_accepted >= len(gen.tokens) // 3
            rate = spec_stats(gen.stats)["acceptance_rate"]
            assert rate is not None and 0 < rate <= 1


def test_draft_model_greedy_identical(smollm2: Model, self_draft: Model) -> None:
    s = SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=24)
    for messages in (QUOTE, FREE):
        ref = plain(smollm2, messages, s)
        smollm2.reset_cache()
        gen = smollm2.generate(messages, s,
                               token_source=draft_model_source(self_draft, smollm2, 5))
        gen.consume()
        same(smollm2, gen.tokens, ref)
        assert_kv_clean(smollm2)
        # The draft's own cache is consistent too (it never keeps cells it does not track).
        assert kv_end(self_draft) == len(self_draft._cached) - 1
        # A model drafting for itself is always right (same kernels, greedy).
        assert gen.stats.draft_tokens > 0
        assert gen.stats.draft_accepted == gen.stats.draft_tokens
    assert not self_draft._lock.locked()


def test_follow_up_turn_reuses_cache(smollm2: Model) -> None:
    """A follow-up turn reuses the prompt and reply a speculative generation left in the cache."""
    smollm2.reset_cache()
    first = smollm2.generate(QUOTE, GREEDY, token_source=lookup_source()).consume()
    turn2 = [*QUOTE, {"role": "assistant", "content": first},
             {"role": "user", "content": "Now only the first sentence."}]
    # Not "reproducible" sampling (engine.host.batch_plan), so the reply's cells are reused too;
    # top-k 1 keeps it greedy in effect.
    gen = smollm2.generate(turn2, SamplingParams(temperature=0.7, top_k=1, max_tokens=20),
                           token_source=lookup_source())
    assert gen.consume()
    # The KV cells it reused (and left) are exactly the ones the engine tracks.
    assert gen.stats.cached_tokens > len(smollm2.chat_tokens(QUOTE))
    assert_kv_clean(smollm2)


@pytest.mark.parametrize("max_tokens", [1, 2, 7, 13])
def test_early_stop_leaves_no_stray_cells(smollm2: Model, max_tokens: int) -> None:
    s = SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=max_tokens)
    ref = plain(smollm2, QUOTE, s)
    smollm2.reset_cache()
    gen = smollm2.generate(QUOTE, s, token_source=lookup_source(8))
    gen.consume()
    same(smollm2, gen.tokens, ref)
    assert gen.stats.stop_reason == "length"
    assert_kv_clean(smollm2)
    # Everything kept in the cache is the prompt plus a prefix of what was handed out.
    prompt = smollm2.chat_tokens(QUOTE)
    assert smollm2._cached[: len(prompt)] == prompt
    assert smollm2._cached[len(prompt):] == gen.tokens[: len(smollm2._cached) - len(prompt)]


def test_stop_string_and_close_mid_draft(smollm2: Model) -> None:
    smollm2.reset_cache()
    gen = smollm2.generate(QUOTE, SamplingParams(temperature=0, repeat_penalty=1.0,
                                                 max_tokens=60, stop=("worm",)),
                           token_source=lookup_source())
    text = gen.consume()
    assert gen.stats.stop_reason == "stop_string"
    assert "worm" not in text
    assert_kv_clean(smollm2)
    # A consumer that walks away after a few pieces: closing the generation cleans up.
    smollm2.reset_cache()
    gen = smollm2.generate(QUOTE, GREEDY, token_source=lookup_source())
    it = iter(gen)
    for _ in range(5):
        next(it)
    cast(Generator[str, None, None], gen._it).close()
    assert_kv_clean(smollm2)
    assert not smollm2._lock.locked()


def test_cancel_leaves_no_stray_cells(smollm2: Model, self_draft: Model) -> None:
    for source in (lookup_source(), draft_model_source(self_draft, smollm2)):
        smollm2.reset_cache()
        cancel = threading.Event()
        gen = smollm2.generate(QUOTE, GREEDY, cancel=cancel, token_source=source)
        pieces = []
        for piece in gen:
            pieces.append(piece)
            if len(pieces) == 6:
                cancel.set()
        assert gen.stats.stop_reason == "cancelled"
        assert_kv_clean(smollm2)
        assert not self_draft._lock.locked()


def test_context_full(smollm2_path: Path) -> None:
    with Model(smollm2_path, exact_params(n_ctx=256, n_threads=1, state_cache_mb=0,
                                          flash_attn="on")) as small:
        # A prompt that leaves ~12 free cells.
        text = "one two three four five six seven eight nine ten" + " one" * 180
        while len(small.chat_tokens([{"role": "user", "content": text + " one"}])) \
                < small.n_ctx - 12:
            text += " one"
        messages = [{"role": "user", "content": text + "\nCount on, in words."}]
        s = SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=200)
        ref = plain(small, messages, s)
        small.reset_cache()
        gen = small.generate(messages, s, token_source=lookup_source())
        gen.consume()
        assert gen.stats.stop_reason == "context_full"
        # A prompt of ~240 tokens is one big batch: past what the guarantee covers.
        same(small, gen.tokens, ref, positions=small.n_ctx,
             batch=len(small.chat_tokens(messages)))
        assert_kv_clean(small)
        assert len(small._cached) <= small.n_ctx - 1


def test_seeded_sampling_matches_plain(smollm2: Model) -> None:
    """One sample per handed-out token from the same logits: the RNG stream is plain's too."""
    s = SamplingParams(temperature=0.8, seed=7, max_tokens=40)
    ref = plain(smollm2, QUOTE, s)
    smollm2.reset_cache()
    gen = smollm2.generate(QUOTE, s, token_source=lookup_source())
    gen.consume()
    same(smollm2, gen.tokens, ref)
    assert_kv_clean(smollm2)


def test_vocabulary_mismatch_refused(smollm2: Model, gemma_path: Path) -> None:
    with pytest.raises(EngineError, match=r"cannot be a draft model.*vocabulary"):
        load_draft_model(gemma_path, smollm2, n_ctx=256)
    gemma = Model(gemma_path, exact_params(n_ctx=256, n_threads=1, state_cache_mb=0))
    try:
        with pytest.raises(EngineError, match="262144 tokens, the model's has 49152"):
            check_vocab(smollm2, gemma)
        with pytest.raises(EngineError):
            draft_model_source(gemma, smollm2)
        with pytest.raises(EngineError):
            DraftModel(gemma, smollm2)
        with pytest.raises(EngineError):
            Speculator(smollm2, SpeculativeSettings(mode="draft", draft_model="x"), draft=gemma)
    finally:
        gemma.close()


def test_prompt_lookup_drafts() -> None:
    p = PromptLookup(ngram_min=2)
    p.begin([1, 2, 3, 4, 5, 9, 2, 3])
    assert p.propose(8) == [4, 5]  # "2 3" seen before, followed by 4 5; a 2-token match
    assert p.last_match == 2
    p.accept(7)
    assert p.propose(3) == []  # "3 7" never seen
    assert p.propose(0) == []
    # A match that overlaps the tail (the text repeats): the draft continues the period.
    p.begin([5, 6, 5, 6, 5])
    assert p.propose(8) == [6, 5, 6] and p.last_match == 3  # 3 agreeing: 3 drafted (CPU)
    with pytest.raises(EngineError):
        PromptLookup(ngram_max=1, ngram_min=2)


def test_prompt_lookup_prefers_the_longest_agreement() -> None:
    """Of two earlier places of the tail's 2-gram, the one whose preceding text agrees with
    the history for longer wins over the more recent one."""
    p = PromptLookup(ngram_min=2)
    p.begin([1, 2, 3, 4, 5, 9, 3, 4, 6, 7, 1, 2, 3, 4])
    assert p.propose(2) == [5, 9]
    assert p.last_match == 4
    # No earlier place agrees beyond the 2-gram: the most recent one.
    p.begin([8, 3, 4, 5, 9, 3, 4, 6, 7, 3, 4])
    assert p.propose(1) == [6]


def test_prompt_lookup_cuts_where_equal_matches_part() -> None:
    """Two equally backed earlier places that go on differently: only the part they agree on
    (at least one token) is drafted."""
    p = PromptLookup(ngram_min=2)
    p.begin([7, 2, 3, 4, 5, 6, 9, 7, 2, 3, 4, 5, 1, 8, 7, 2, 3])
    # "7 2 3" twice before, going on "4 5 6" and "4 5 1": a 3-token agreement drafts 4,
    # but the two places part after "4 5".
    assert p.last_match == 0 and p.propose(8) == [4, 5] and p.last_match == 3
    p.begin([1, 2, 5, 9, 1, 2, 6, 8, 1, 2])
    assert p.propose(8) == [6]  # they part at once: one token, from the most recent


def test_draft_length_follows_the_agreement() -> None:
    lengths = [PromptLookup.draft_len(a) for a in range(2, 40)]
    assert lengths == sorted(lengths)  # a longer agreement never drafts less
    assert PromptLookup.draft_len(2) < PromptLookup.draft_len(16)
    # A long quote: the history copies 30 tokens of the prompt, so the draft is long.
    quote = list(range(100, 160))
    p = PromptLookup()
    p.begin([*quote, 7, *quote[:30]])
    assert p.propose(64) == quote[30:30 + PromptLookup.draft_len(30)]
    assert p.last_match >= 16 and PromptLookup.draft_len(30) >= 8


def test_draft_length_follows_the_verification_cost() -> None:
    """The length with the most expected tokens per unit of decode cost, or no draft when a
    plain step is better. Where extra positions are cheap (AMX weights) weak matches draft
    further than with the generic CPU kernels, where each position costs ~0.4 decodes."""
    cpu = [PromptLookup.draft_len(a, COST_CPU) for a in (2, 3, 15, 16, 40)]
    amx = [PromptLookup.draft_len(a, COST_AMX) for a in (2, 3, 15, 16, 40)]
    assert cpu == [2, 3, 3, 9, 9]
    assert amx == [6, 7, 7, 16, 16]
    assert COST_AMX(1) == COST_CPU(1) == 1.0 and COST_AMX(2) == 1.81
    # When a two-token batch costs as much as two decodes, drafting one token never pays.
    assert PromptLookup.draft_len(2, VerifyCost(2.0, 0.1), limit=1) == 0
    p = PromptLookup(cost=COST_AMX)
    p.begin([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0, 1, 2, 3])
    assert p.propose(64) == [4, 5, 6, 7, 8, 9, 10]  # a 3-token match drafts 7
    # Two equally backed places that part after one token: a 1-token draft is not worth a
    # 2-token batch on AMX (1.81 decodes for at most 2 tokens), so nothing is drafted.
    p.begin([1, 2, 5, 9, 1, 2, 6, 8, 1, 2])
    assert p.propose(8) == []


def test_cost_curve_follows_the_kernels(smollm2: Model) -> None:
    assert not smollm2.amx_weights and verify_cost(smollm2) == COST_CPU


def test_settings_validation(smollm2: Model) -> None:
    with pytest.raises(EngineError, match="needs a draft model"):
        SpeculativeSettings(mode="draft").validate()
    with pytest.raises(EngineError, match="between 1 and 64"):
        SpeculativeSettings(mode="lookup", draft_max=0).validate()
    with pytest.raises(EngineError, match="off, lookup or draft"):
        SpeculativeSettings(mode="fast").validate()  # type: ignore[arg-type]
    with pytest.raises(EngineError):
        lookup_source(0)
    assert Speculator(smollm2, SpeculativeSettings()).token_source() is None
    assert Speculator(smollm2, SpeculativeSettings(mode="lookup")).token_source() is not None
    with pytest.raises((EngineError, GGUFError, OSError)):
        Speculator(smollm2, SpeculativeSettings(mode="draft", draft_model="/nonexistent.gguf"))


def test_verification_batches_do_not_count_as_prompt_work(smollm2: Model) -> None:
    smollm2.reset_cache()
    gen = smollm2.generate(QUOTE, SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=48),
                           token_source=lookup_source())
    gen.consume()
    st = gen.stats
    assert st.draft_tokens > 0
    assert st.n_prompt_eval == st.prompt_tokens - st.cached_tokens
    # Tokens decoded after the prompt: every emitted token but the last, plus rejected drafts.
    assert st.n_eval >= st.gen_tokens - 1
    assert 0.5 * st.gen_tps <= st.gen_tps_wall <= 1.1 * st.gen_tps


def test_small_context_batch_limit(exact_smollm2_path: Path) -> None:
    """n_ctx 64: llama.cpp rounds the context up to 256 but caps one decode at 64 tokens.
    Prompts longer than that are fed in chunks, drafts never make a verification batch
    longer than that, and the cache never holds more than the context (this used to abort
    inside llama.cpp)."""
    with Model(exact_smollm2_path, exact_params(n_ctx=64, n_threads=1, state_cache_mb=0,
                                        flash_attn="on")) as small:
        assert small.n_batch == 64 < small.n_ctx
        text = "alpha beta gamma delta epsilon zeta eta theta iota kappa " * 8
        messages = [{"role": "user", "content": text + "\nRepeat the list twice."}]
        assert 64 < len(small.chat_tokens(messages)) < small.n_ctx - 40
        s = SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=300)
        ref = plain(small, messages, s)
        assert ref
        for source in (lookup_source(64), lookup_source(200)):
            small.reset_cache()
            gen = small.generate(messages, s, token_source=source)
            gen.consume()
            same(small, gen.tokens, ref)
            assert gen.stats.draft_tokens > 0
            assert_kv_clean(small)
            assert len(small._cached) <= small.n_ctx - 1


def test_speculation_set_at_load(exact_smollm2_path: Path, smollm2: Model) -> None:
    """LoadParams.speculative: every generation drafts without the caller asking, flash
    attention 'auto' turns on for it, and the text is plain decoding's."""
    ref = plain(smollm2, QUOTE, GREEDY)
    params = exact_params(n_ctx=1024, n_threads=1, state_cache_mb=0,
                        speculative=SpeculativeSettings(mode="lookup"))
    with Model(exact_smollm2_path, params) as m:
        assert m.speculator is not None
        assert flash_line(m) == "enabled"  # 'auto' is on when drafting
        gen = m.generate(QUOTE, GREEDY)
        gen.consume()
        same(m, gen.tokens, ref)
        assert gen.stats.draft_tokens > 0 and gen.stats.draft_accepted > 0
        # A caller's own source still wins.
        m.reset_cache()
        own = m.generate(QUOTE, GREEDY, token_source=lookup_source(1))
        own.consume()
        same(m, own.tokens, ref)
    with Model(exact_smollm2_path, exact_params(n_ctx=256, n_threads=1, state_cache_mb=0)) as m:
        assert m.speculator is None
        assert flash_line(m) == "disabled"  # and off for plain decoding on a CPU
        gen = m.generate(QUOTE, SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=8))
        gen.consume()
        assert gen.stats.draft_tokens == 0


@pytest.mark.skipif(not (llama_lib.amx_build() and llama_lib.amx_kernels_safe()),
                    reason="this llama.cpp build has no usable AMX kernels")
def test_drafting_with_amx_weights(smollm2_path: Path) -> None:
    """With AMX weights one-token and batch products round differently whatever flash
    attention does, so drafting keeps the faster default (off on a CPU) instead of forcing
    it on; drafts are still verified by the model and leave no stray cells."""
    params = LoadParams(n_ctx=1024, n_threads=1, state_cache_mb=0,
                        speculative=SpeculativeSettings(mode="lookup"))
    with Model(smollm2_path, params) as m:
        assert not m.exactness.exact and flash_line(m) == "disabled"
        gen = m.generate(QUOTE, GREEDY)
        gen.consume()
        assert gen.stats.draft_accepted > 0 and len(gen.tokens) > 8
        assert_kv_clean(m)


def test_draft_with_other_vocabulary_refused_at_load(smollm2_path: Path,
                                                     gemma_path: Path) -> None:
    params = exact_params(n_ctx=256, n_threads=1, state_cache_mb=0,
                        speculative=SpeculativeSettings(mode="draft",
                                                        draft_model=str(gemma_path)))
    with pytest.raises(EngineError, match=r"cannot be a draft model.*vocabulary") as err:
        Model(smollm2_path, params)
    assert "\n" not in str(err.value)
