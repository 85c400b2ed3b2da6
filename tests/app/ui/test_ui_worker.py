"""The engine thread on the real SmolLM2: exact signal sequences for load, generate, stop,
unload and failures, coalescing of token signals, and the request id every reply signal
carries (0 for failures that are not about a reply)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pytestqt.qtbot import QtBot

from app.ui.worker import EngineHost, EngineWorker, LoadedModel
from engine.host.runtime import Model
from engine.host.stats import GenerationStats
from engine.settings import LoadParams, SamplingParams
from tests.app.ui.ui_signal_log import SignalLog

PARAMS = LoadParams(n_ctx=2048, n_threads=2)
GREEDY = SamplingParams(temperature=0.0, max_tokens=24)
CHAT = [{"role": "user", "content": "Name three colours."}]


def make_host(interval: float | None = None) -> EngineHost:
    worker = EngineWorker() if interval is None else EngineWorker(token_interval_s=interval)
    return EngineHost(worker)


@pytest.fixture
def host() -> Iterator[EngineHost]:
    h = make_host()
    yield h
    h.shutdown()


def load(qtbot: QtBot, host: EngineHost, log: SignalLog, path: Path) -> LoadedModel:
    with qtbot.waitSignal(log.got_loaded, timeout=60_000) as blocker:
        host.load(path, PARAMS)
    info = blocker.args[0]
    assert isinstance(info, LoadedModel)
    return info


def generate(
    qtbot: QtBot, host: EngineHost, log: SignalLog, sampling: SamplingParams = GREEDY
) -> GenerationStats:
    with qtbot.waitSignal(log.got_finished, timeout=120_000) as blocker:
        rid = host.generate(CHAT, sampling)
    stats = blocker.args[0]
    assert isinstance(stats, GenerationStats)
    # Every signal about the reply carries the id `generate` returned.
    assert rid > 0 and {r for _, r, _ in log.replies} == {rid}
    return stats


def test_load_emits_progress_then_loaded(
    qtbot: QtBot, host: EngineHost, smollm2_path: Path
) -> None:
    log = SignalLog(host.worker)
    info = load(qtbot, host, log, smollm2_path)
    qtbot.wait(50)  # nothing else may follow `loaded`
    assert log.squeezed() == ["progress", "loaded"]
    progress = log.values("progress")
    assert progress == sorted(progress) and progress[-1] == pytest.approx(1.0)
    assert info.path == smollm2_path and info.n_ctx == 2048
    # What llama.cpp reported allocating: weights, KV cache, compute and output buffers.
    assert set(info.actual_bytes) == {"weights", "kv", "compute", "output"}
    assert info.actual_total == sum(info.actual_bytes.values()) > info.actual_bytes["weights"]


def test_reply_streams_in_order_and_matches_direct_generation(
    qtbot: QtBot, host: EngineHost, smollm2_path: Path, smollm2: Model
) -> None:
    log = SignalLog(host.worker)
    load(qtbot, host, log, smollm2_path)
    log.clear()
    stats = generate(qtbot, host, log)
    assert log.squeezed() == ["started", "tokens", "finished"]
    chunks: list[Any] = log.values("tokens")
    counts = [n for _, n in chunks]
    assert counts == sorted(counts) and counts[-1] == stats.gen_tokens
    streamed = "".join(text for text, _ in chunks)
    # The same greedy request straight on the engine (another Model of the same file) gives
    # the same text: the thread and the coalescing lose and reorder nothing.
    smollm2.reset_cache()
    direct = smollm2.generate(CHAT, GREEDY).consume()
    assert streamed == direct and streamed.strip()
    assert log.values("started") == [stats.prompt_tokens]
    assert stats.gen_tokens > 0 and stats.ttft_s > 0 and stats.gen_tps > 0
    # The next reply has an id of its own.
    first = log.request_ids("finished")[0]
    log.clear()
    generate(qtbot, host, log)
    assert log.request_ids("finished")[0] > first


def test_tokens_are_coalesced(qtbot: QtBot, smollm2_path: Path) -> None:
    """With an interval longer than the reply, the first piece goes out at once (so time to
    first token shows) and everything else arrives as one flush before `finished`; with no
    interval every piece is its own signal."""
    texts = {}
    for interval in (3600.0, 0.0):
        h = make_host(interval)
        try:
            log = SignalLog(h.worker)
            load(qtbot, h, log, smollm2_path)
            log.clear()
            stats = generate(qtbot, h, log)
            chunks = log.values("tokens")
            texts[interval] = "".join(t for t, _ in chunks)
            if interval:
                assert log.names == ["started", "tokens", "tokens", "finished"]
            else:
                assert len(chunks) >= stats.gen_tokens - 2  # a UTF-8 split may merge pieces
        finally:
            h.shutdown()
    assert texts[3600.0] == texts[0.0]


def test_stop_cancels_before_next_token(qtbot: QtBot, host: EngineHost, smollm2_path: Path) -> None:
    log = SignalLog(host.worker)
    load(qtbot, host, log, smollm2_path)
    log.clear()
    log.got_tokens.connect(host.stop)  # stop as soon as the first text arrives
    with qtbot.waitSignal(log.got_finished, timeout=120_000) as blocker:
        host.generate(CHAT, SamplingParams(temperature=0.0, max_tokens=1500))
    stats = blocker.args[0]
    assert stats.stop_reason == "cancelled"
    assert stats.gen_tokens < 1500
    assert log.squeezed() == ["started", "tokens", "finished"]
    with qtbot.assertNotEmitted(log.got_tokens, wait=100):
        pass


def test_generate_without_model_fails_with_message(qtbot: QtBot, host: EngineHost) -> None:
    log = SignalLog(host.worker)
    with qtbot.waitSignal(log.got_failed, timeout=10_000) as blocker:
        rid = host.generate(CHAT, GREEDY)
    assert "No model is loaded" in blocker.args[0]
    assert log.names == ["failed"]
    assert log.request_ids("failed") == [rid] and rid > 0  # about that reply


@pytest.mark.parametrize("content", [b"not a gguf file at all" * 10, b"GGUF\x03\x00\x00\x00"])
def test_corrupt_model_file_fails_with_message(
    qtbot: QtBot, host: EngineHost, tmp_path: Path, content: bytes
) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(content)
    log = SignalLog(host.worker)
    with (
        qtbot.assertNotEmitted(log.got_loaded),
        qtbot.waitSignal(log.got_failed, timeout=10_000) as blocker,
    ):
        host.load(bad, PARAMS)
    message = blocker.args[0]
    assert message.startswith("Could not load broken.gguf: ")
    assert "\n" not in message and "Traceback" not in message
    assert log.names == ["failed"]
    assert log.request_ids("failed") == [0]  # not about a reply


def test_truncated_real_model_fails_with_message(
    qtbot: QtBot, host: EngineHost, tmp_path: Path, smollm2_path: Path
) -> None:
    bad = tmp_path / "cut.gguf"
    with smollm2_path.open("rb") as f:
        bad.write_bytes(f.read(smollm2_path.stat().st_size // 2))
    log = SignalLog(host.worker)
    with qtbot.waitSignal(log.got_failed, timeout=30_000) as blocker:
        host.load(bad, PARAMS)
    assert blocker.args[0].startswith("Could not load cut.gguf: ")
    assert log.names == ["failed"]


def test_cancelled_load(qtbot: QtBot, host: EngineHost, smollm2_path: Path) -> None:
    log = SignalLog(host.worker)
    # The cancel lands either before llama.cpp's next progress callback (which then aborts
    # the load) or after its last one (the worker checks again): both end the same way.
    with qtbot.waitSignal(log.got_load_cancelled, timeout=30_000):
        host.load(smollm2_path, PARAMS)
        host.cancel_load()
    assert "loaded" not in log.names
    assert log.names[-1] == "load_cancelled"
    assert host.worker.model is None


def test_unload_then_generate_fails(qtbot: QtBot, host: EngineHost, smollm2_path: Path) -> None:
    log = SignalLog(host.worker)
    load(qtbot, host, log, smollm2_path)
    log.clear()
    with qtbot.waitSignal(log.got_unloaded, timeout=10_000):
        host.unload()
    with qtbot.waitSignal(log.got_failed, timeout=10_000):
        host.generate(CHAT, GREEDY)
    assert log.names == ["unloaded", "failed"]


def refused_by_the_chat(
    qtbot: QtBot, host: EngineHost, chat_path: Path, other: Path, message: str
) -> None:
    """With `chat_path` loaded, loading `other` fails with `message` and unloads nothing."""
    log = SignalLog(host.worker)
    load(qtbot, host, log, chat_path)
    chat_model = host.worker.model
    with (
        qtbot.assertNotEmitted(log.got_loaded),
        qtbot.waitSignal(log.got_failed, timeout=10_000) as blocker,
    ):
        host.load(other, PARAMS)
    assert blocker.args[0] == message
    assert host.worker.model is chat_model and chat_model is not None  # nothing unloaded
    assert host.worker.host.names() == [host.worker.engine.name]  # type: ignore[union-attr]


@pytest.mark.slow
def test_an_embedding_model_is_refused_by_the_chat_which_keeps_its_model(
    qtbot: QtBot, host: EngineHost, smollm2_path: Path, minilm_path: Path
) -> None:
    refused_by_the_chat(
        qtbot,
        host,
        smollm2_path,
        minilm_path,
        f"{minilm_path.name} is an embedding model: it cannot chat. "
        "The Local server gives its vectors at /v1/embeddings",
    )


@pytest.mark.slow
def test_a_reranker_is_refused_by_the_chat_as_a_reranker(
    qtbot: QtBot, host: EngineHost, smollm2_path: Path, reranker_path: Path
) -> None:
    refused_by_the_chat(
        qtbot,
        host,
        smollm2_path,
        reranker_path,
        f"{reranker_path.name} is a reranker: it cannot chat. "
        "The Local server ranks documents with it at /v1/rerank",
    )
