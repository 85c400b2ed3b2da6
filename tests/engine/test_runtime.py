"""The engine on the real SmolLM2: determinism, cancellation, stats, templates, UTF-8."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from engine.errors import EngineError, LoadCancelled
from engine.host.batch_plan import plan
from engine.host.runtime import Model
from engine.settings import LoadParams, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=32)
QUESTION = [{"role": "user", "content": "Name three primary colors."}]
# Long enough (64+ tokens) that a greedy follow-up may reuse it (engine.host.batch_plan).
LONG_QUESTION = [
    {"role": "user", "content": "I paint walls for a living. " * 10 + "Name three primary colors."}
]


def test_greedy_is_deterministic(smollm2: Model) -> None:
    smollm2.reset_cache()
    a = smollm2.generate(QUESTION, GREEDY).consume()
    smollm2.reset_cache()
    b = smollm2.generate(QUESTION, GREEDY).consume()
    assert a == b
    assert len(a) > 10
    # The same answer also comes back when the prompt is served from the KV cache.
    c = smollm2.generate(QUESTION, GREEDY).consume()
    assert c == a


def test_seeded_sampling_is_reproducible(smollm2: Model) -> None:
    s = SamplingParams(temperature=0.9, seed=1234, max_tokens=24)
    smollm2.reset_cache()
    a = smollm2.generate(QUESTION, s).consume()
    smollm2.reset_cache()
    b = smollm2.generate(QUESTION, s).consume()
    assert a == b


def test_chat_template_applied(smollm2: Model) -> None:
    text = smollm2.render_chat([{"role": "system", "content": "Be brief."}, *QUESTION])
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert text.endswith("<|im_start|>assistant\n")
    rendered = smollm2.render_chat(QUESTION)
    tokens = smollm2.chat_tokens(QUESTION)
    # Special tokens are parsed as single tokens, not spelled out as text.
    im_start = smollm2.tokenize("<|im_start|>", add_special=False)
    assert len(im_start) == 1
    assert tokens.count(im_start[0]) == rendered.count("<|im_start|>") >= 2


def test_stops_within_one_token_from_another_thread(smollm2: Model) -> None:
    smollm2.reset_cache()
    cancel = threading.Event()
    gen = smollm2.generate(
        [{"role": "user", "content": "Write a very long story about a lighthouse."}],
        SamplingParams(temperature=0, max_tokens=400),
        cancel=cancel,
    )
    seen_at_cancel: list[int] = []
    it = iter(gen)
    next(it)

    def stopper() -> None:
        seen_at_cancel.append(len(gen.tokens))
        cancel.set()

    t = threading.Thread(target=stopper)
    t.start()
    t.join()
    rest = list(it)
    assert gen.stats.stop_reason == "cancelled"
    # The loop checks the flag before every token: at most the token in flight finishes.
    assert len(gen.tokens) <= seen_at_cancel[0] + 1
    assert len(rest) <= 2


def test_stats_consistent_with_wall_clock(smollm2: Model) -> None:
    smollm2.reset_cache()
    t0 = time.perf_counter()
    gen = smollm2.generate(
        [{"role": "user", "content": "Describe the sea in a few sentences."}],
        SamplingParams(temperature=0, max_tokens=64),
    )
    gen.consume()
    wall = time.perf_counter() - t0
    st = gen.stats
    assert st.prompt_tokens == len(gen.prompt)
    assert st.gen_tokens == len(gen.tokens) > 1
    assert 0 < st.ttft_s < st.total_s <= wall
    # llama.cpp's counters and our wall clock describe the same work.
    assert st.n_prompt_eval == st.prompt_tokens
    assert st.prompt_eval_ms / 1000 <= st.ttft_s
    assert st.eval_ms / 1000 <= st.total_s
    # The wall-clock rate includes sampling and our own loop, so it is a little lower than
    # llama.cpp's pure decode rate, never higher, and of the same magnitude.
    assert 0.5 * st.gen_tps <= st.gen_tps_wall <= 1.1 * st.gen_tps
    assert st.eval_ms / 1000 <= st.total_s - st.ttft_s + 0.05


def test_follow_up_reuses_kv_cache(smollm2: Model) -> None:
    smollm2.reset_cache()
    first = smollm2.generate(LONG_QUESTION, GREEDY)
    answer = first.consume()
    follow = [
        *LONG_QUESTION,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And three secondary colors?"},
    ]
    second = smollm2.generate(follow, GREEDY)
    second.consume()
    # Greedy: the question stays cached as far as the kernels allow (engine.host.batch_plan:
    # with flash attention the last 64+ tokens are read again in one batch; where only
    # identical batches agree, "grid", reuse stops at the last batch boundary).
    n = second.stats.prompt_tokens
    kept = plan(n, len(first.prompt), smollm2.n_batch, smollm2.split_rule).start
    assert second.stats.cached_tokens == kept
    if smollm2.split_rule != "grid":
        assert kept > 0 and second.stats.n_prompt_eval < n
    # A sampled follow-up is not reproducible anyway: it reuses the whole question on any kernels.
    sampled = smollm2.generate(follow, SamplingParams(temperature=0.8, max_tokens=4))
    sampled.consume()
    assert sampled.stats.cached_tokens >= len(first.prompt) - 1 > 0


def test_max_tokens_and_stop_strings(smollm2: Model) -> None:
    smollm2.reset_cache()
    g = smollm2.complete("1, 2, 3, 4, 5,", SamplingParams(temperature=0, max_tokens=5))
    g.consume()
    assert g.stats.stop_reason == "length" and g.stats.gen_tokens == 5
    smollm2.reset_cache()
    g = smollm2.complete(
        "1, 2, 3, 4, 5,", SamplingParams(temperature=0, max_tokens=40, stop=(" 9",))
    )
    text = g.consume()
    assert g.stats.stop_reason == "stop_string"
    assert " 9" not in text and text.strip().startswith("6")


def test_utf8_pieces_never_split(smollm2: Model) -> None:
    smollm2.reset_cache()
    reply = smollm2.generate(
        [{"role": "user", "content": "Repeat exactly: 日本語のテキスト 🎉🎉 café"}],
        SamplingParams(temperature=0, max_tokens=48),
    )
    pieces = list(reply)
    assert pieces
    # A reply cut by its token limit inside a character ends with that character's bytes,
    # flushed as U+FFFD; nowhere else may a character arrive split.
    whole = pieces if reply.stats.stop_reason != "length" else pieces[:-1]
    for p in pieces:
        p.encode("utf-8")  # every piece is valid text
    for p in whole:
        assert "\ufffd" not in p
    # Multi-byte characters need several tokens each; they still arrive whole.
    assert any(ord(ch) > 0x3000 for ch in "".join(pieces))


def test_prompt_longer_than_context(smollm2_path: Path) -> None:
    # llama.cpp rounds small contexts up to 256 tokens; the message names the real size.
    with (
        Model(smollm2_path, LoadParams(n_ctx=64, n_threads=2)) as m,
        pytest.raises(EngineError, match="context holds") as exc,
    ):
        m.generate([{"role": "user", "content": "word " * 400}], GREEDY)
    assert f"context holds {m.n_ctx};" in str(exc.value)


def test_an_unloaded_model_refuses_work_instead_of_crashing(smollm2_path: Path) -> None:
    m = Model(smollm2_path, LoadParams(n_ctx=256, n_threads=1))
    m.close()
    for call in (
        lambda: m.tokenize("hello"),
        lambda: m.token_bytes(1),
        lambda: m.generate(QUESTION, GREEDY),
        lambda: m.is_eog(2),
    ):
        with pytest.raises(EngineError, match="has been unloaded"):
            call()


def test_context_full_ends_generation(smollm2_path: Path) -> None:
    with Model(smollm2_path, LoadParams(n_ctx=64, n_threads=2)) as m:
        g = m.generate(QUESTION, SamplingParams(temperature=0, max_tokens=500))
        g.consume()
        assert g.stats.stop_reason in ("context_full", "stop")
        assert g.stats.prompt_tokens + g.stats.gen_tokens <= m.n_ctx


def test_load_progress_and_cancel(smollm2_path: Path) -> None:
    seen: list[float] = []
    with Model(smollm2_path, LoadParams(n_ctx=256, n_threads=2), progress=seen.append) as m:
        assert m.n_ctx == 256
    assert seen and seen[-1] == pytest.approx(1.0)
    assert seen == sorted(seen)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(LoadCancelled):
        Model(smollm2_path, LoadParams(n_ctx=256), cancel=cancel)


def test_bad_parameters_are_refused(smollm2_path: Path) -> None:
    with pytest.raises(EngineError, match="KV cache type"):
        Model(smollm2_path, LoadParams(type_k="q3_x"))
    with pytest.raises(EngineError, match="flash attention"):
        Model(smollm2_path, LoadParams(type_v="q8_0", flash_attn="off"))
    with pytest.raises(EngineError, match="temperature"):
        SamplingParams(temperature=-1).validate()


@pytest.mark.model
def test_corrupt_file_never_reaches_llama(tmp_path: Path) -> None:
    from engine.model.gguf import GGUFError

    p = tmp_path / "broken.gguf"
    p.write_bytes(b"GGUF" + b"\xff" * 40)
    with pytest.raises(GGUFError):
        Model(p)


def test_switching_back_to_a_conversation_restores_its_kv_state(smollm2: Model) -> None:
    story = "Tell me about the history of lighthouses. " * 12
    a1 = [{"role": "user", "content": story}]

    def follow_up(answer: str) -> list[dict[str, str]]:
        return [*a1, {"role": "assistant", "content": answer}, {"role": "user", "content": "More?"}]

    # Reference: the follow-up right after the first turn, the KV cache never left.
    cache, smollm2.state_cache = smollm2.state_cache, None
    try:
        smollm2.reset_cache()
        answer_a = smollm2.generate(a1, GREEDY).consume()
        direct = smollm2.generate(follow_up(answer_a), GREEDY).consume()
    finally:
        smollm2.state_cache = cache
    # Same conversation, but another one takes the context in between.
    smollm2.reset_cache()
    gen_a = smollm2.generate(a1, GREEDY)
    assert gen_a.consume() == answer_a
    smollm2.generate([{"role": "user", "content": "What is bread made of?"}], GREEDY).consume()
    gen = smollm2.generate(follow_up(answer_a), GREEDY)
    gen.consume()
    # Going back did not process the first conversation's history again, as far as this
    # machine's kernels allow a greedy reply to reuse it (only the answer, generated token by
    # token, and the new turn are evaluated again in a batch, of 64+ tokens with flash
    # attention; under "grid", only whole batches from position 0: engine.host.batch_plan)...
    n = gen.stats.prompt_tokens
    kept = plan(n, len(gen_a.prompt), smollm2.n_batch, smollm2.split_rule).start
    assert gen.stats.cached_tokens >= kept
    assert gen.stats.n_prompt_eval <= n - kept
    assert smollm2.state_cache is not None
    if kept > 0:
        assert smollm2.state_cache.stats.restores >= 1
    # ...and the restored snapshot behaves exactly as if the context had never left.
    assert gen.text == direct
