"""A projector's memory before load and its first-load protection: sized and tried in a
child process (engine.native.load_probe.probe_projector), counted in the estimate, and
checked against what the real load logged."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import EngineError
from engine.host.runtime import Model
from engine.memory import placement
from engine.memory.estimate import estimate
from engine.memory.params import EstimateParams
from engine.native.load_probe import FirstLoads, probe_projector
from engine.native.native_load import FAULT_ENV
from engine.settings import LoadParams


@pytest.mark.parametrize("which", ["vision", "audio"])
def test_the_estimate_with_a_projector_is_what_llama_cpp_allocated(
    smollm2_path: Path,
    vision_projector_path: Path,
    audio_projector_path: Path,
    which: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mmproj = vision_projector_path if which == "vision" else audio_projector_path
    params = LoadParams(n_ctx=2048, n_threads=2, mmproj=str(mmproj))
    est = estimate(smollm2_path, EstimateParams(load=params))
    without = estimate(smollm2_path, EstimateParams(load=LoadParams(n_ctx=2048, n_threads=2)))
    # The small-batch graph lanes' buffers are made after the load, by the first such batch.
    monkeypatch.setattr(placement, "graph_lanes_share", lambda *_: 0.0)
    at_load = estimate(smollm2_path, EstimateParams(load=params))
    with Model(smollm2_path, params) as m:
        assert m.projector is not None
        sizes = m.projector.sizes
        actual = m.memory_actual.total_bytes
    assert sizes.weights_bytes > 0 and sizes.compute_bytes > 0
    # The projector adds exactly what its load logged, and the whole is within 1% of the log.
    assert est.total_bytes - without.total_bytes == sizes.weights_bytes + sizes.compute_bytes
    assert abs(at_load.total_bytes - actual) <= 0.01 * actual
    assert 0 < est.total_bytes - at_load.total_bytes <= 0.06 * est.compute_bytes
    assert any(n.startswith(f"RAM includes the projector {mmproj.name}: ") for n in est.notes)


def test_a_projector_for_another_width_is_refused_by_the_probe(
    gemma_path: Path, vision_projector_path: Path
) -> None:
    with pytest.raises(EngineError) as e:
        probe_projector(gemma_path, vision_projector_path)
    assert str(e.value) == (
        f"{vision_projector_path.name} is not a projector for this model: mismatch between "
        "text model (n_embd = 640) and mmproj (n_embd = 576)"
    )


def test_a_crash_while_trying_a_projector_names_it_and_spares_this_process(
    smollm2_path: Path, vision_projector_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAULT_ENV, "abort")  # the child's load aborts inside llama.cpp
    with pytest.raises(EngineError) as e:
        probe_projector(smollm2_path, vision_projector_path)
    message = str(e.value)
    assert message.startswith(
        f"llama.cpp crashed while loading the projector {vision_projector_path.name} (SIGABRT)"
    )
    assert "\n" not in message


def test_a_projector_is_tried_in_a_child_once(
    smollm2_path: Path, vision_projector_path: Path, tmp_path: Path
) -> None:
    loads = FirstLoads(tmp_path)
    params = LoadParams(n_ctx=512, n_threads=2, mmproj=str(vision_projector_path))
    with Model(smollm2_path, params, first_loads=loads):
        pass
    assert loads.known(vision_projector_path)
    assert not loads.probe_projector_unless_known(smollm2_path, vision_projector_path)


def test_without_a_child_the_estimate_counts_the_header_until_a_load_sized_it(
    smollm2_path: Path, audio_projector_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.memory import projector
    from engine.model.gguf import read_gguf

    monkeypatch.setattr(projector, "_sized", {})  # nothing sized in this process yet
    load = LoadParams(n_ctx=1024, n_threads=2, mmproj=str(audio_projector_path))
    params = EstimateParams(load=load)
    header = read_gguf(smollm2_path)
    bare = estimate(header, params.with_load(mmproj=None), method="analytic")
    quick = estimate(header, params, method="analytic", probe_projector=False)
    weights = projector.header_weights(audio_projector_path)
    assert quick.total_bytes - bare.total_bytes == weights
    assert any("compute buffer is sized when it first loads" in n for n in quick.notes)
    with Model(smollm2_path, load) as m:
        assert m.projector is not None
        sizes = m.projector.sizes
    # The header's count is what libmtmd loads; its log rounds to 0.01 MiB.
    assert abs(sizes.weights_bytes - weights) <= 0.005 * (1 << 20)
    after = estimate(header, params, method="analytic", probe_projector=False)
    assert after.total_bytes - bare.total_bytes == sizes.weights_bytes + sizes.compute_bytes
