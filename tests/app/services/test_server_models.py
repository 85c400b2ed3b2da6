"""The server's model store over a real library, download manager and the local Hub
emulator: Hugging Face names, pulls (progress, verified, resumable), copies, created models
kept across restarts, and deletes that never remove a file Candlewick does not own."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.services.discovery import DiscoveryRoots
from app.services.download_jobs import DONE, PAUSED
from app.services.download_manager import DownloadManager
from app.services.hub import HubClient
from app.services.hub_names import parse_hub_name
from app.services.library import ModelLibrary
from app.services.named_models import NamedModels
from app.services.server_models import LibraryModelStore
from app.services.verified_transfer import DownloadError
from engine.server.model_store import NamedModel, PullProgress, StoreError
from tests.hub_emulator import HubEmulator, file_sha256, running_hub, tiny_gguf

REPO = "owner/Tiny-GGUF"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tiny")
    return {
        q: tiny_gguf(d / f"tiny-{q}.gguf", name=f"tiny {q}", n_embd=64 if q != "Q8_0" else 128)
        for q in ("Q4_K_M", "Q8_0")
    }


@pytest.fixture
def hub(files: dict[str, Path]) -> Iterator[HubEmulator]:
    with running_hub() as emu:
        r = emu.repo(REPO)
        for q, path in files.items():
            r.add(f"Tiny-{q}.gguf", source=path)
        yield emu


class World:
    def __init__(self, root: Path, hub: HubEmulator) -> None:
        self.root = root
        self.lm_studio = root / "lm-studio"
        self.library = ModelLibrary(
            root / "models",
            bundled=False,
            discovery=DiscoveryRoots(lm_studio=(self.lm_studio,)),
        )
        self.downloads = DownloadManager(
            self.library.downloads_state,
            HubClient(hub.url),
            cache_dir=root / "hf" / "hub",
            chunk_size=4096,  # a stop is seen between chunks
        )
        self.store = LibraryModelStore(self.library, self.downloads, poll_s=0.05)
        self.removed: list[Path] = []

    def before_remove(self, path: Path) -> None:
        self.removed.append(path)

    def pull(self, name: str) -> tuple[list[PullProgress], Path]:
        seen: list[PullProgress] = []
        made = self.store.pull(self.store.plan_pull(name), seen.append, threading.Event())
        return seen, made.path


@pytest.fixture
def world(tmp_path: Path, hub: HubEmulator) -> Iterator[World]:
    w = World(tmp_path, hub)
    yield w
    w.downloads.close()


def test_hugging_face_names() -> None:
    n = parse_hub_name("hf.co/bartowski/SmolLM2-GGUF:Q4_K_M")
    assert n is not None and (n.repo_id, n.tag) == ("bartowski/SmolLM2-GGUF", "Q4_K_M")
    n = parse_hub_name("huggingface.co/bartowski/SmolLM2-GGUF")
    assert n is not None and n.tag == "latest"
    assert n.name == "huggingface.co/bartowski/SmolLM2-GGUF:latest"
    n = parse_hub_name("owner/repo:q8_0")
    assert n is not None and (n.repo_id, n.tag) == ("owner/repo", "q8_0")
    for not_hub in ("llama3", "llama3:8b", "a/b/c", "hf.co/onlyowner", ""):
        assert parse_hub_name(not_hub) is None, not_hub


def test_pull_verifies_reports_and_names_the_file(world: World, files: dict[str, Path]) -> None:
    plan = world.store.plan_pull(f"hf.co/{REPO}")  # no tag: Q4_K_M, as Ollama picks it
    assert plan.name == f"hf.co/{REPO}:latest"
    sha = file_sha256(files["Q4_K_M"])
    assert [f.digest for f in plan.files] == [f"sha256:{sha}"]
    seen, path = world.pull(f"hf.co/{REPO}:q4_k_m")  # a tag in any case
    assert seen[-1] == PullProgress(f"sha256:{sha}", files["Q4_K_M"].stat().st_size, seen[-1].total)
    assert path.read_bytes() == files["Q4_K_M"].read_bytes()
    job = world.downloads.jobs()[0]
    assert job.status == DONE and job.sha256 == sha
    named = world.store.named(f"hf.co/{REPO}:Q4_K_M")
    assert named is not None and named.kind == "pull" and named.path == path
    # The library lists the download; a copy by its id names the same file.
    entry = next(e for e in world.library.entries() if e.path == path)
    assert entry.source == "downloaded"
    assert world.store.copy(entry.id, "by-id").path == path


def test_names_the_hub_does_not_have(world: World) -> None:
    with pytest.raises(StoreError) as e:
        world.store.plan_pull("hf.co/nobody/nothing-GGUF:Q4_K_M")
    assert e.value.status == 404
    with pytest.raises(StoreError) as e:
        world.store.plan_pull(f"hf.co/{REPO}:Q2_K")
    assert e.value.status == 404 and "Q4_K_M, Q8_0" in e.value.message
    with pytest.raises(StoreError) as e:
        world.store.plan_pull("llama3")
    assert e.value.status == 400 and "hf.co/owner/repo:QUANT" in e.value.message


def test_a_pull_left_pauses_and_the_next_one_resumes(
    world: World, hub: HubEmulator, files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = threading.Event()
    pause = world.downloads.pause

    def pausing(job_id: str) -> None:
        pause(job_id)
        asked.set()

    monkeypatch.setattr(world.downloads, "pause", pausing)
    key = (REPO, "Tiny-Q8_0.gguf")
    hub.hold_at[key] = 4096
    plan = world.store.plan_pull(f"{REPO}:Q8_0")
    stop = threading.Event()
    failed: list[StoreError] = []

    def run() -> None:
        try:
            world.store.pull(plan, lambda p: None, stop)
        except StoreError as e:
            failed.append(e)

    t = threading.Thread(target=run)
    t.start()
    assert hub.held.wait(60)
    stop.set()  # the client went away
    assert asked.wait(60)
    hub.released.set()
    t.join(60)
    assert failed and failed[0].status == 500
    job = world.downloads.jobs()[0]
    assert job.status == PAUSED and job.done_bytes > 0
    hub.hold_at.clear()
    _, path = world.pull(f"{REPO}:Q8_0")
    assert path.read_bytes() == files["Q8_0"].read_bytes()
    ranges = [r.get("range") for r in hub.file_requests("Tiny-Q8_0.gguf")]
    assert ranges[-1] is not None and not ranges[-1].startswith("bytes=0-"), ranges


def test_copy_and_create_are_names_kept_across_restarts(world: World) -> None:
    _, path = world.pull(f"hf.co/{REPO}:Q4_K_M")
    world.store.copy(f"hf.co/{REPO}:Q4_K_M", "tiny")
    copy = world.store.named("tiny:latest")
    assert copy is not None and copy.kind == "copy" and copy.path == path
    made = world.store.create(
        "pirate",
        "tiny",
        system="Talk like a pirate.",
        parameters={"temperature": 0.2},
        messages=[{"role": "user", "content": "Ahoy"}],
        license=["MIT"],
    )
    assert made.has_recipe and made.path == path
    # Over a created model: what is given replaces, the rest is kept.
    world.store.create(
        "pirate2", "pirate", system=None, parameters={"seed": 7}, messages=[], license=[]
    )
    again = NamedModels(world.library.models_dir / "named-models.json")  # a restart
    p2 = again.get("PIRATE2")  # names in any case
    assert p2 is not None and p2.system == "Talk like a pirate."
    assert dict(p2.parameters) == {"temperature": 0.2, "seed": 7}
    assert list(p2.messages) == [{"role": "user", "content": "Ahoy"}]
    entry = next(e for e in world.library.entries() if e.path == path)
    with pytest.raises(StoreError) as e:
        world.store.copy("tiny", entry.id)
    assert e.value.status == 400 and "library model" in e.value.message
    with pytest.raises(StoreError) as e:
        world.store.create("x", "missing", system=None, parameters={}, messages=[], license=[])
    assert e.value.status == 404 and e.value.param == "from"


def test_delete_names_then_the_file(world: World) -> None:
    _, path = world.pull(f"hf.co/{REPO}:Q4_K_M")
    world.store.copy(f"hf.co/{REPO}:Q4_K_M", "tiny")
    entry = next(e for e in world.library.entries() if e.path == path)
    with pytest.raises(StoreError) as e:  # a copy is made from it
        world.store.delete(entry.id, world.before_remove)
    assert e.value.status == 400 and "tiny:latest" in e.value.message
    world.store.delete("tiny", world.before_remove)  # a name only
    assert path.exists() and world.removed == []
    blob = path.resolve()
    world.store.delete(f"hf.co/{REPO}:Q4_K_M", world.before_remove)  # its last name
    assert world.removed == [path]
    assert not path.exists() and not blob.exists()
    assert world.downloads.jobs() == [] and world.library.entries() == []
    with pytest.raises(StoreError) as e:
        world.store.delete("tiny", world.before_remove)
    assert e.value.status == 404


def test_another_tools_file_leaves_the_library_and_stays(
    world: World, files: dict[str, Path]
) -> None:
    theirs = world.lm_studio / "someone" / "tiny" / "tiny-Q8_0.gguf"
    theirs.parent.mkdir(parents=True)
    theirs.write_bytes(files["Q8_0"].read_bytes())
    entry = next(e for e in world.library.entries() if e.source == "lm-studio")
    world.store.delete(entry.id, world.before_remove)
    assert theirs.exists() and world.removed == [theirs]
    assert world.library.entries() == []
    linked = world.library.import_file(theirs)  # importing it brings it back
    assert linked.linked
    world.store.delete(linked.id, world.before_remove)
    assert theirs.exists() and world.library.entries() == []


def test_a_store_makes_its_download_manager_at_the_first_pull(
    tmp_path: Path, hub: HubEmulator
) -> None:
    library = ModelLibrary(tmp_path / "models", bundled=False, discovery=False)
    made: list[DownloadManager] = []

    def make() -> DownloadManager:
        hub_client = HubClient(hub.url)
        made.append(DownloadManager(library.downloads_state, hub_client, cache_dir=tmp_path / "hf"))
        return made[-1]

    store = LibraryModelStore(library, make)
    with pytest.raises(StoreError):
        store.delete("nothing", lambda path: None)
    store.close()
    assert made == [] and not library.downloads_state.exists()  # nothing read nor written
    store = LibraryModelStore(library, make)
    store.pull(store.plan_pull(f"{REPO}:Q8_0"), lambda p: None, threading.Event())
    assert len(made) == 1 and store.downloads is made[0]
    store.close()
    with pytest.raises(DownloadError):  # closed with the store
        made[0].add(REPO, "Tiny-Q4_K_M.gguf")


def test_an_unreadable_names_file_is_kept_aside_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "named-models.json"
    path.write_text("{not json", "utf-8")
    names = NamedModels(path)
    assert names.all() == []
    names.put(NamedModel("mine:latest", tmp_path / "m.gguf", "m", "copy"))
    assert (tmp_path / "named-models.json.unreadable").read_text("utf-8") == "{not json"
    again = NamedModels(path).get("mine")
    assert again is not None and again.path == tmp_path / "m.gguf"
