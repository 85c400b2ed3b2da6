"""Speculative decoding on the real SmolLM2: same greedy output, clean KV cache, vocab checks.

Every request goes through the model's one decode loop (`model.loop`, engine.host.scheduler):
prompt lookup is chosen per request (`spec="lookup"`) or per model (`LoadParams.speculative`),
and a draft model is loaded by the target itself (`SpeculativeSettings(mode="draft", ...)`)."""

from __future__ import annotations

import dataclasses
import gc
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from engine.errors import EngineError
from engine.host.generation import Generation
from engine.host.requests import Event, Piece
from engine.host.runtime import Model
from engine.host.speculative import (
    COST_AMX,
    COST_AMX_SMALL_BATCH,
    COST_COLUMNS,
    COST_CPU,
    COST_GPU,
    REQUEST_EXPLORE_EVERY,
    REQUEST_MIN_VERIFIED,
    DraftYield,
    PromptLookup,
    Speculator,
    VerifyCost,
    check_vocab,
    draft_params,
    spec_stats,
    verify_cost,
)
from engine.host.stats import GenerationStats
from engine.memory import cpu_kernels
from engine.memory.cpu_kernels import CpuFeatures
from engine.model.gguf import GGUFError, read_gguf
from engine.native import llama_lib
from engine.settings import (
    DEFAULT_DRAFT_MAX,
    LoadParams,
    SamplingParams,
    SpecMode,
    SpeculativeSettings,
)
from tests.engine.drafting import always_draft  # noqa: F401 (a fixture)
from tests.exactness import assert_same_greedy

# What drafts do, not whether this machine finds them worth it (tests/engine/drafting.py).
pytestmark = pytest.mark.usefixtures("always_draft")

# Short prompts and answers (under 64 and 256 tokens): where `Model.exactness` covers them,
# greedy output must match plain decoding token for token (tests/exactness.py).
QUOTE = [
    {
        "role": "user",
        "content": "The quick brown fox jumps over the lazy dog. The early bird catches the worm. "
        "Repeat both sentences exactly, then repeat them again.",
    }
]
FREE = [{"role": "user", "content": "Write a short list of three fruits and their colors."}]
# Drafts copy text the repeat penalty would discourage: these tests measure drafting alone.
GREEDY = SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=32)


def exact_params(**kw: Any) -> LoadParams:
    """Load settings where drafting can give plain decoding's tokens: no extra buffers."""
    return LoadParams(extra_buffers=False, **kw)


def self_drafting(path: Path, **kw: Any) -> LoadParams:
    """`path` drafting for itself: its drafts are always right, the strictest check."""
    return exact_params(
        speculative=SpeculativeSettings(
            mode="draft", draft_model=str(path), draft_max=kw.pop("draft_max", 5)
        ),
        **kw,
    )


def same(
    m: Model, got: list[int], ref: list[int], *, positions: int = 255, batch: int = 63
) -> None:
    assert_same_greedy(m.exactness, got, ref, positions=positions, batch=batch)


@pytest.fixture(scope="module")
def smollm2(exact_smollm2_path: Path) -> Iterator[Model]:
    """SmolLM2's batch-invariant twin with flash attention on and no extra buffers: where
    llama.cpp's CPU kernels give the same logits for a token decoded alone or inside a
    verification batch (at short contexts), which exactness needs (docs/speculative.md).
    No speculative setting: each request chooses (`spec=`)."""
    model = Model(exact_smollm2_path, exact_params(n_ctx=2048, n_threads=1, flash_attn="on"))
    yield model
    model.close()


@pytest.fixture(scope="module")
def self_draft(exact_smollm2_path: Path) -> Iterator[Model]:
    """SmolLM2 loaded with itself as its draft model (the target loads the draft)."""
    model = Model(
        exact_smollm2_path,
        self_drafting(
            exact_smollm2_path, n_ctx=1024, n_threads=1, state_cache_mb=0, flash_attn="on"
        ),
    )
    assert model.speculator is not None
    yield model
    model.close()


def flash_auto(path: Path, n_ctx: int) -> str:
    """How llama.cpp reports 'auto' resolved for this file and one sequence of `n_ctx` cells on
    this build's CPU: on, except where the kernel would go element by element over its heads
    or decode them slower past a crossover the context reaches (engine.settings)."""
    gf = read_gguf(path)
    flash = cpu_kernels.resolve_flash_attn_for("auto", gf, "f16", "f16", n_ctx=n_ctx, gpu=False)
    return "enabled" if flash == "on" else "disabled"


def flash_line(model: Model) -> str:
    """What llama.cpp says it did with flash attention when it created the context."""
    line = next(x for x in model.load_info.log if "flash_attn " in x and "=" in x)
    return line.split("=", 1)[1].strip()


def cached(model: Model) -> list[int]:
    """What slot 0 (the only one of these models) holds, by the decode loop's bookkeeping."""
    return model.loop.slot_tokens()[0]


def assert_kv_clean(model: Model) -> None:
    """The loop is idle and llama.cpp's cells are exactly what it tracks: in every slot, and
    in every sequence of the draft model."""
    loop = model.loop
    assert loop.wait_idle()
    assert loop.kv_positions() == [len(t) for t in loop.slot_tokens()]
    spec = model.speculator
    if spec is None:
        return
    C = llama_lib.lib()

    def draft_cells() -> list[tuple[int, int]]:
        return [
            (int(C.llama_memory_seq_pos_max(spec.draft.memory_ptr, seq)) + 1, len(spec.tokens(seq)))
            for seq in range(loop.n_slots)
        ]

    for held, tracked in loop.call_soon(draft_cells):
        assert held == tracked


def plain(model: Model, messages: list[dict[str, str]], s: SamplingParams) -> list[int]:
    model.reset_cache()
    gen = model.generate(messages, s, spec="off")
    gen.consume()
    assert gen.stats.draft_tokens == 0
    assert_kv_clean(model)
    return list(gen.tokens)


def test_prompt_lookup_greedy_identical(smollm2: Model) -> None:
    for messages in (QUOTE, FREE):
        ref = plain(smollm2, messages, GREEDY)
        smollm2.reset_cache()
        gen = smollm2.generate(messages, GREEDY, spec="lookup")
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


def test_per_request_choice(smollm2: Model) -> None:
    """One model without a speculative setting: each request chooses. Lookup drafts, "off"
    and the default do not, and all give the same greedy tokens; a draft model that is not
    loaded is refused in one line, and the loop goes on serving."""
    assert smollm2.params.speculative is None and smollm2.speculator is None
    runs: dict[SpecMode | None, Generation] = {}
    for spec in (None, "off", "lookup"):
        smollm2.reset_cache()
        runs[spec] = gen = smollm2.generate(QUOTE, GREEDY, spec=spec)
        gen.consume()
        assert_kv_clean(smollm2)
    assert runs[None].stats.draft_tokens == 0 and runs["off"].stats.draft_tokens == 0
    assert runs["lookup"].stats.draft_tokens > 0
    assert 0 < runs["lookup"].stats.draft_accepted <= runs["lookup"].stats.draft_tokens
    assert runs[None].tokens == runs["off"].tokens  # the same plain path
    same(smollm2, runs["lookup"].tokens, runs["off"].tokens)
    with pytest.raises(EngineError, match="no draft model is loaded") as err:
        smollm2.generate(QUOTE, GREEDY, spec="draft")
    assert "\n" not in str(err.value)
    assert_kv_clean(smollm2)
    again = smollm2.generate(QUOTE, GREEDY, spec="lookup")
    again.consume()
    same(smollm2, again.tokens, runs["off"].tokens)


def test_draft_model_greedy_identical(self_draft: Model) -> None:
    s = SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=24)
    for messages in (QUOTE, FREE):
        ref = plain(self_draft, messages, s)
        self_draft.reset_cache()
        gen = self_draft.generate(messages, s)  # the model's own setting: its draft model
        gen.consume()
        same(self_draft, gen.tokens, ref)
        # The target's cache, and the draft's (it never keeps cells it does not track).
        assert_kv_clean(self_draft)
        # A model drafting for itself is always right (same kernels, greedy).
        assert gen.stats.draft_tokens > 0
        assert gen.stats.draft_accepted == gen.stats.draft_tokens
    # Nothing is left holding the loop: a second request (on the cells the first left, the
    # draft's sequence included) runs and gives the same tokens.
    assert self_draft.loop.wait_idle()
    again = self_draft.generate(FREE, s)
    again.consume()
    same(self_draft, again.tokens, gen.tokens)
    assert again.stats.draft_accepted == again.stats.draft_tokens > 0
    assert_kv_clean(self_draft)


def test_follow_up_turn_reuses_cache(smollm2: Model) -> None:
    """A follow-up turn reuses the prompt and reply a speculative generation left in the cache."""
    smollm2.reset_cache()
    first = smollm2.generate(QUOTE, GREEDY, spec="lookup").consume()
    turn2 = [
        *QUOTE,
        {"role": "assistant", "content": first},
        {"role": "user", "content": "Now only the first sentence."},
    ]
    # Not "reproducible" sampling (engine.host.batch_plan), so the reply's cells are reused too;
    # top-k 1 keeps it greedy in effect.
    gen = smollm2.generate(
        turn2, SamplingParams(temperature=0.7, top_k=1, max_tokens=20), spec="lookup"
    )
    assert gen.consume()
    # The KV cells it reused (and left) are exactly the ones the engine tracks.
    assert gen.stats.cached_tokens > len(smollm2.chat_tokens(QUOTE))
    assert_kv_clean(smollm2)


@pytest.mark.parametrize("max_tokens", [1, 2, 7, 13])
def test_early_stop_leaves_no_stray_cells(smollm2: Model, max_tokens: int) -> None:
    s = SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=max_tokens)
    ref = plain(smollm2, QUOTE, s)
    smollm2.reset_cache()
    gen = smollm2.generate(QUOTE, s, spec="lookup")
    gen.consume()
    same(smollm2, gen.tokens, ref)
    assert gen.stats.stop_reason == "length"
    assert_kv_clean(smollm2)
    # Everything kept in the cache is the prompt plus a prefix of what was handed out.
    prompt = smollm2.chat_tokens(QUOTE)
    held = cached(smollm2)
    assert held[: len(prompt)] == prompt
    assert held[len(prompt) :] == gen.tokens[: len(held) - len(prompt)]


def test_stop_string_and_close_mid_draft(smollm2: Model) -> None:
    smollm2.reset_cache()
    gen = smollm2.generate(
        QUOTE,
        SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=60, stop=("worm",)),
        spec="lookup",
    )
    text = gen.consume()
    assert gen.stats.stop_reason == "stop_string"
    assert "worm" not in text
    assert_kv_clean(smollm2)
    # A consumer that walks away after a few pieces: closing the generation cleans up.
    smollm2.reset_cache()
    gen = smollm2.generate(QUOTE, GREEDY, spec="lookup")
    it = iter(gen)
    for _ in range(5):
        next(it)
    gen.close()
    assert gen.request.done.is_set()
    assert_kv_clean(smollm2)
    # One that drops it without closing: cancelled when collected, cleaned up the same way.
    smollm2.reset_cache()
    dropped = smollm2.generate(QUOTE, GREEDY, spec="lookup")
    next(iter(dropped))
    req = dropped.request
    del dropped, it, gen
    gc.collect()
    assert req.done.wait(60)
    assert_kv_clean(smollm2)
    # Nothing holds the loop afterwards: the next request runs to its end.
    after = smollm2.generate(QUOTE, GREEDY, spec="lookup")
    assert after.consume() and after.stats.stop_reason in ("stop", "length")
    assert_kv_clean(smollm2)


def cancel_after_pieces(model: Model, n_pieces: int, spec: SpecMode | None) -> GenerationStats:
    """A request whose caller sets its stop flag once `n_pieces` text pieces came out. The flag
    is set on the decode thread, as the piece is handed out, so the loop sees it before its
    next step: the request is always cancelled mid-reply, however fast the machine is."""
    cancel = threading.Event()
    pieces: list[str] = []

    def on_event(ev: Event) -> None:
        if isinstance(ev, Piece):
            pieces.append(ev.text)
            if len(pieces) == n_pieces:
                cancel.set()

    req = model.loop.submit(
        model.chat_tokens(QUOTE), GREEDY, on_event, cancel=cancel, interactive=True, spec=spec
    )
    assert req.done.wait(120)
    return req.stats


def test_cancel_leaves_no_stray_cells(smollm2: Model, self_draft: Model) -> None:
    cases: list[tuple[Model, SpecMode | None]] = [(smollm2, "lookup"), (self_draft, None)]
    for model, spec in cases:
        model.reset_cache()
        st = cancel_after_pieces(model, 6, spec)
        assert st.stop_reason == "cancelled"
        assert st.draft_tokens > 0 and st.gen_tokens < GREEDY.max_tokens
        assert_kv_clean(model)
        # A cancelled request's cells are freed at once (the client is gone).
        assert cached(model) == []
        # And the loop serves the next request.
        nxt = model.generate(
            QUOTE, SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=8), spec=spec
        )
        nxt.consume()
        assert nxt.stats.stop_reason in ("stop", "length")
        assert_kv_clean(model)


def test_context_full(smollm2_path: Path) -> None:
    with Model(
        smollm2_path, exact_params(n_ctx=256, n_threads=1, state_cache_mb=0, flash_attn="on")
    ) as small:
        # A prompt that leaves ~12 free cells.
        text = "one two three four five six seven eight nine ten" + " one" * 180
        while (
            len(small.chat_tokens([{"role": "user", "content": text + " one"}])) < small.n_ctx - 12
        ):
            text += " one"
        messages = [{"role": "user", "content": text + "\nCount on, in words."}]
        s = SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=200)
        ref = plain(small, messages, s)
        small.reset_cache()
        gen = small.generate(messages, s, spec="lookup")
        gen.consume()
        assert gen.stats.stop_reason == "context_full"
        # A prompt of ~240 tokens is one big batch: past what the guarantee covers.
        same(small, gen.tokens, ref, positions=small.n_ctx, batch=len(small.chat_tokens(messages)))
        assert_kv_clean(small)
        assert len(cached(small)) <= small.n_ctx - 1


def test_seeded_sampling_matches_plain(smollm2: Model) -> None:
    """One sample per handed-out token from the same logits: the RNG stream is plain's too."""
    s = SamplingParams(temperature=0.8, seed=7, max_tokens=40)
    ref = plain(smollm2, QUOTE, s)
    smollm2.reset_cache()
    gen = smollm2.generate(QUOTE, s, spec="lookup")
    gen.consume()
    same(smollm2, gen.tokens, ref)
    assert_kv_clean(smollm2)


def test_vocabulary_mismatch_refused(smollm2: Model, gemma_path: Path) -> None:
    # Gemma loaded the way a target loads its draft model, then offered as one.
    gemma = Model(
        gemma_path, draft_params(smollm2.params, n_ctx=256, n_seq_max=1), decode_loop=False
    )
    try:
        with pytest.raises(EngineError, match="262144 tokens, the model's has 49152"):
            check_vocab(smollm2, gemma)
        with pytest.raises(EngineError, match=r"cannot be a draft model.*vocabulary") as err:
            Speculator(smollm2, gemma)
        assert "\n" not in str(err.value)
    finally:
        gemma.close()
    # The refusal changed nothing on the target.
    assert smollm2.speculator is None
    assert_kv_clean(smollm2)


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
    assert p.propose(64) == quote[30 : 30 + PromptLookup.draft_len(30)]
    assert p.last_match >= 16 and PromptLookup.draft_len(30) == DEFAULT_DRAFT_MAX


def test_draft_length_follows_the_verification_cost() -> None:
    """The length with the most expected tokens per unit of decode cost, or no draft when a
    plain step is better. Where extra positions are cheap (AMX weights) weak matches draft
    further than with the generic CPU kernels, where each position costs ~0.4 decodes."""
    cpu = [PromptLookup.draft_len(a, COST_CPU, 16) for a in (2, 3, 15, 16, 40)]
    amx = [PromptLookup.draft_len(a, COST_AMX, 16) for a in (2, 3, 15, 16, 40)]
    assert cpu == [2, 3, 3, 9, 9]
    assert amx == [6, 7, 7, 16, 16]
    # The column kernels' bend (four tokens cheap, each from five dear): three drafts, seven
    # only after a strong match, whose copy rarely breaks.
    columns = [PromptLookup.draft_len(a, COST_COLUMNS, 16) for a in (2, 3, 15, 16, 40)]
    assert columns == [3, 3, 3, 7, 7]
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


def test_a_bent_cost_gives_its_sizes_then_a_step_a_token() -> None:
    table = VerifyCost(1.2, 0.3, then=(1.35, 1.5, 1.95))
    assert [table(n) for n in (0, 1, 2, 4, 5)] == [1.0, 1.0, 1.2, 1.5, 1.95]
    assert table(7) == pytest.approx(1.95 + 2 * 0.3)
    # Without sizes of its own, the straight line.
    assert VerifyCost(1.2, 0.3)(7) == pytest.approx(1.2 + 5 * 0.3)
    with pytest.raises(EngineError):
        VerifyCost(0.0, 0.3)
    with pytest.raises(EngineError):
        VerifyCost(1.2, 0.3, then=(0.0,))
    with pytest.raises(EngineError):
        VerifyCost(1.2, -0.1)


def test_a_request_whose_drafts_do_not_pay_stops_drafting() -> None:
    """A request's own check: drafts go until REQUEST_MIN_VERIFIED have been verified; while
    the verified ones gave fewer tokens than their batches cost, only every
    REQUEST_EXPLORE_EVERY-th chance drafts; drafts that pay open it again at once."""
    curve = VerifyCost(1.2, 0.2)
    y = DraftYield()
    for _ in range(REQUEST_MIN_VERIFIED - 1):
        y.add(3, 0, curve)  # 1 token for 1.6 decodes
        assert y.allows()
    y.add(3, 0, curve)
    chances = [y.allows() for _ in range(2 * REQUEST_EXPLORE_EVERY)]
    assert chances.count(True) == 2 and chances[REQUEST_EXPLORE_EVERY - 1]
    y.add(3, 3, curve)  # 4 tokens for 1.6 decodes
    y.add(3, 3, curve)
    assert y.gained > y.spent and y.allows()


def test_prompt_lookup_holds_back_drafts_its_request_lost_on() -> None:
    """The loop reports each verified draft (`verified`); after enough that gave nothing the
    same match proposes nothing, and the next request starts afresh."""
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2]
    p = PromptLookup(cost=VerifyCost(1.2, 0.2))
    p.begin(prompt)
    draft = p.propose(8)
    assert draft
    for _ in range(REQUEST_MIN_VERIFIED):
        p.verified(len(draft), 0)
    assert p.propose(8) == [] and p.last_match == 2  # matched, but held back
    p.begin(prompt)
    assert p.propose(8) == draft


def test_cost_curve_follows_the_kernels(smollm2: Model) -> None:
    """SmolLM2's weights are Q4_1 and Q8_0: the project's build multiplies them with its column
    kernels on x86 (installers/llama_cpp/quant_columns.patch), where a drafted token costs less."""
    columns = cpu_kernels.detect().quant_columns
    assert not smollm2.amx_weights and smollm2.column_kernels == columns
    assert verify_cost(smollm2) == (COST_COLUMNS if columns else COST_CPU)


@pytest.mark.parametrize("small_batch", [False, True])
def test_amx_cost_curve_follows_the_builds_small_batch_kernels(
    monkeypatch: pytest.MonkeyPatch, small_batch: bool
) -> None:
    """The project's build verifies up to 6 tokens on AMX's vector kernels: the second token
    is then cheap, so a 3-token agreement drafts shorter, tighter drafts than the tile path's
    curve; a build without the patch keeps the tile path's curve."""
    features = CpuFeatures(amx_int8=True, amx_small_batch=small_batch)
    monkeypatch.setattr(cpu_kernels, "detect", lambda: features)
    amx = SimpleNamespace(load_info=SimpleNamespace(n_gpu_layers=0), amx_weights=True)
    cost = verify_cost(amx)
    assert cost == (COST_AMX_SMALL_BATCH if small_batch else COST_AMX)
    assert (cost(2) < 1.5) == small_batch
    # The generic kernels and GPUs do not depend on it.
    generic = SimpleNamespace(load_info=amx.load_info, amx_weights=False, column_kernels=False)
    assert verify_cost(generic) == COST_CPU
    columns = SimpleNamespace(load_info=amx.load_info, amx_weights=False, column_kernels=True)
    assert verify_cost(columns) == COST_COLUMNS
    gpu = SimpleNamespace(load_info=SimpleNamespace(n_gpu_layers=1), amx_weights=True)
    assert verify_cost(gpu) == COST_GPU


def test_settings_validation(smollm2: Model) -> None:
    with pytest.raises(EngineError, match="needs a draft model"):
        SpeculativeSettings(mode="draft").validate()
    with pytest.raises(EngineError, match="between 1 and 64"):
        SpeculativeSettings(mode="lookup", draft_max=0).validate()
    with pytest.raises(EngineError, match="off, lookup or draft"):
        SpeculativeSettings(mode="fast").validate()  # type: ignore[arg-type]
    with pytest.raises(EngineError, match="between 1 and 64"):
        LoadParams(speculative=SpeculativeSettings(mode="lookup", draft_max=0)).validate()
    # No setting: no draft model, and nothing drafts unless a request asks.
    assert not smollm2.params.drafting and smollm2.speculator is None
    # A draft model that cannot be read fails the target's load (and leaves no loop behind).
    with pytest.raises((EngineError, GGUFError, OSError)):
        Model(
            smollm2.path,
            exact_params(
                n_ctx=256,
                n_threads=1,
                state_cache_mb=0,
                speculative=SpeculativeSettings(mode="draft", draft_model="/nonexistent.gguf"),
            ),
        )


def test_verification_batches_do_not_count_as_prompt_work(smollm2: Model) -> None:
    smollm2.reset_cache()
    gen = smollm2.generate(
        QUOTE, SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=48), spec="lookup"
    )
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
    longer than that (a draft model asked for 64 tokens a step, prompt lookup for its own
    lengths), and the cache never holds more than the context (this used to abort inside
    llama.cpp)."""
    params = self_drafting(
        exact_smollm2_path, draft_max=64, n_ctx=64, n_threads=1, state_cache_mb=0, flash_attn="on"
    )
    with Model(exact_smollm2_path, params) as small:
        assert small.n_batch == 64 < small.n_ctx
        text = "alpha beta gamma delta epsilon zeta eta theta iota kappa " * 8
        messages = [{"role": "user", "content": text + "\nRepeat the list twice."}]
        assert 64 < len(small.chat_tokens(messages)) < small.n_ctx - 40
        s = SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=300)
        ref = plain(small, messages, s)
        assert ref
        # Prompt lookup drafts up to 7 tokens a step (batches within the guarantee); the
        # draft model asks for 64, so its verification batches fill n_batch, past it.
        arms: list[tuple[SpecMode, int]] = [("lookup", 63), ("draft", small.n_batch)]
        for spec, batch in arms:
            small.reset_cache()
            gen = small.generate(messages, s, spec=spec)
            gen.consume()
            # Both fill the context: a speculative reply must go on as far as plain decoding's
            # (however its text went), not end with room left for its last drafts.
            assert gen.stats.stop_reason == "context_full"
            assert len(gen.tokens) == len(ref), (spec, len(gen.tokens), len(ref))
            same(small, gen.tokens, ref, batch=batch)
            assert gen.stats.draft_tokens > 0
            assert_kv_clean(small)
            assert len(cached(small)) <= small.n_ctx - 1


def test_speculation_set_at_load(exact_smollm2_path: Path, smollm2: Model) -> None:
    """LoadParams.speculative: every generation drafts without the caller asking, flash
    attention 'auto' is on for it (as for any CPU load), and the text is plain decoding's."""
    ref = plain(smollm2, QUOTE, GREEDY)
    params = exact_params(
        n_ctx=1024, n_threads=1, state_cache_mb=0, speculative=SpeculativeSettings(mode="lookup")
    )
    with Model(exact_smollm2_path, params) as m:
        assert m.params.drafting
        assert m.speculator is None  # prompt lookup needs no second model
        assert flash_line(m) == flash_auto(exact_smollm2_path, 1024)  # as for any CPU load
        gen = m.generate(QUOTE, GREEDY)
        gen.consume()
        same(m, gen.tokens, ref)
        assert gen.stats.draft_tokens > 0 and gen.stats.draft_accepted > 0
        # A request's own choice still wins.
        m.reset_cache()
        own = m.generate(QUOTE, GREEDY, spec="off")
        own.consume()
        same(m, own.tokens, ref)
        assert own.stats.draft_tokens == 0
        assert_kv_clean(m)
    with Model(exact_smollm2_path, exact_params(n_ctx=256, n_threads=1, state_cache_mb=0)) as m:
        assert m.speculator is None
        assert flash_line(m) == flash_auto(exact_smollm2_path, 256)  # plain decoding on a CPU too
        gen = m.generate(QUOTE, SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=8))
        gen.consume()
        assert gen.stats.draft_tokens == 0


@pytest.mark.skipif(
    not (llama_lib.amx_build() and llama_lib.amx_kernels_safe()),
    reason="this llama.cpp build has no usable AMX kernels",
)
def test_drafting_with_amx_weights(smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With AMX weights one-token and batch products round differently whatever flash
    attention does, so drafting keeps the faster default (off on such a CPU for a context past
    the crossover) instead of forcing it on; drafts are still verified by the model and leave
    no stray cells. The project's build has no crossover (its small tiles), so the rules are
    read as for a build without them."""
    upstream = dataclasses.replace(cpu_kernels.detect(), fa_small_tiles=False)
    monkeypatch.setattr(cpu_kernels, "detect", lambda: upstream)
    n_ctx = cpu_kernels.FLASH_ATTN_NARROW_CROSSOVER + 512  # past it on an AVX512-FP16 Xeon
    params = LoadParams(
        n_ctx=n_ctx, n_threads=1, state_cache_mb=0, speculative=SpeculativeSettings(mode="lookup")
    )
    with Model(smollm2_path, params) as m:
        assert flash_auto(smollm2_path, n_ctx) == "disabled"
        assert not m.exactness.exact and flash_line(m) == "disabled"
        gen = m.generate(QUOTE, GREEDY)
        gen.consume()
        assert gen.stats.draft_accepted > 0 and len(gen.tokens) > 8
        assert_kv_clean(m)


def test_draft_with_other_vocabulary_refused_at_load(smollm2_path: Path, gemma_path: Path) -> None:
    params = exact_params(
        n_ctx=256,
        n_threads=1,
        state_cache_mb=0,
        speculative=SpeculativeSettings(mode="draft", draft_model=str(gemma_path)),
    )
    with pytest.raises(EngineError, match=r"cannot be a draft model.*vocabulary") as err:
        Model(smollm2_path, params)
    assert "\n" not in str(err.value)
