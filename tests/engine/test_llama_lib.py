"""The llama.cpp binding layer: backend init and the log route."""

from __future__ import annotations

import threading

import pytest

from engine.native import llama_lib


def test_backend_init_may_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA build logs its devices from inside llama_backend_init ("ggml_cuda_init: found 1
    CUDA devices"); the log callback must not wait for the lock that init holds (this hung
    Candlewick on its first GPU machine)."""

    def init_that_logs() -> None:
        llama_lib._on_log(2, b"ggml_cuda_init: found 1 CUDA devices\n", None)

    monkeypatch.setattr(llama_lib.C, "llama_backend_init", init_that_logs)
    monkeypatch.setattr(llama_lib, "_initialised", False)
    with llama_lib.capture_log() as lines:
        worker = threading.Thread(target=llama_lib.lib, daemon=True)
        worker.start()
        worker.join(10)
    assert not worker.is_alive(), "lib() deadlocked on a log line written during init"
    assert lines == ["ggml_cuda_init: found 1 CUDA devices"]
    assert llama_lib._initialised
