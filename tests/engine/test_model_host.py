"""The model host with several real models: load on demand (one load for many waiters), idle
unloading, pins, least-recently-used eviction within a memory budget, and refusals that say why.

The models are SmolLM2 (~200 MiB loaded at a 512-token context), a copy of it under another
file name (a third model of known size) and Gemma-3-270M (~770 MiB); budgets are chosen
between those sizes, as measured by the memory estimate the host plans with."""

from __future__ import annotations

import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine.errors import EngineError
from engine.host.budget import MemoryBudget
from engine.host.host import (
    Loadable,
    ModelBusy,
    ModelHost,
    ModelNotFound,
    NoRoom,
    estimate_need,
    load_model,
)
from engine.host.runtime import Model
from engine.memory.hardware import GiB
from engine.settings import LoadParams, SamplingParams
from tests.waiting import until

pytestmark = pytest.mark.slow
# No RAM prompt cache: the budgets below are sized from llama.cpp's buffers alone (the host
# reserves a cache's whole budget besides them: tests/engine/test_host_memory_figures.py).
PARAMS = LoadParams(n_ctx=512, n_threads=2, state_cache_mb=0)
MiB = 1 << 20
HI = [{"role": "user", "content": "Hi"}]
TWO = SamplingParams(max_tokens=2, temperature=0)


@pytest.fixture(scope="module")
def specs(
    smollm2_path: Path, gemma_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Loadable]:
    copy = tmp_path_factory.mktemp("models") / "smol-copy.gguf"
    shutil.copyfile(smollm2_path, copy)
    return {
        "smol": Loadable("smol", smollm2_path, PARAMS, aliases=("smollm2",)),
        "copy": Loadable("copy", copy, PARAMS),
        "gemma": Loadable("gemma", gemma_path, PARAMS, title="Gemma 3 270M"),
    }


class Counting:
    """The real loader, counting loads per model (and optionally slowed, so waiters pile up)."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.loads: dict[str, int] = {}
        self.delay_s = delay_s
        self._lock = threading.Lock()

    def __call__(self, spec: Loadable) -> Model:
        with self._lock:
            self.loads[spec.name] = self.loads.get(spec.name, 0) + 1
        time.sleep(self.delay_s)
        return load_model(spec)


@pytest.fixture
def make_host(specs: dict[str, Loadable]) -> Iterator[Callable[..., ModelHost]]:
    hosts: list[ModelHost] = []

    def make(budget_mib: int | None = None, **kw: object) -> ModelHost:
        budget = MemoryBudget({"CPU": budget_mib * MiB}) if budget_mib is not None else None
        host = ModelHost(lambda: list(specs.values()), budget, **kw)  # type: ignore[arg-type]
        hosts.append(host)
        return host

    yield make
    for h in hosts:
        h.close()


def need_mib(spec: Loadable) -> int:
    """What the host plans for loading `spec` (its estimate), in MiB of RAM: AMX or repacked
    weight copies make it depend on the CPU (Gemma ~770 MiB on an EPYC, ~975 on an AMX Xeon)."""
    return -(-estimate_need(spec).devices["CPU"] // MiB)


def room_for_gemma_and_one_smol(specs: dict[str, Loadable]) -> int:
    """A budget with room for Gemma and one SmolLM2, not for a second SmolLM2 besides."""
    smol = need_mib(specs["smol"])
    return need_mib(specs["gemma"]) + smol + smol // 2


def loaded(host: ModelHost) -> list[str]:
    return sorted(h.name for h in host.hosted() if h.state == "ready")


def test_a_model_is_loaded_on_demand_by_any_of_its_names(
    make_host: Callable[..., ModelHost], specs: dict[str, Loadable]
) -> None:
    host = make_host()
    assert loaded(host) == []
    for name in ("smol", "SMOLLM2", specs["smol"].path.name, specs["smol"].path.stem):
        with host.acquire(name) as lease:
            assert lease.name == "smol"
            assert lease.model.generate(HI, TWO).consume()
    assert loaded(host) == ["smol"] and host.loads == 1
    with pytest.raises(ModelNotFound) as e:
        host.acquire("llama3")
    assert str(e.value) == "model 'llama3' not found; available: copy, gemma, smol"
    assert e.value.names == ["copy", "gemma", "smol"]


def test_eight_waiters_share_one_load(make_host: Callable[..., ModelHost]) -> None:
    loader = Counting(delay_s=0.5)  # the load outlasts the requests' arrival
    host = make_host(loader=loader)
    leases, errors = [], []
    lock = threading.Lock()

    def ask() -> None:
        try:
            lease = host.acquire("gemma")
            with lock:
                leases.append(lease)
        except Exception as e:  # collected: the assertion below names it
            errors.append(e)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    # While it loads the host counts what the estimate said it will take.
    assert until(lambda: any(h.memory for h in host.hosted()), 10)
    loading = next(h for h in host.hosted() if h.name == "gemma")
    assert loading.state == "loading" and loading.memory["CPU"] > 500 * MiB
    for t in threads:
        t.join(120)
    assert not errors
    assert loader.loads == {"gemma": 1} and host.loads == 1
    assert len({id(lease.model) for lease in leases}) == 1
    assert next(h for h in host.hosted() if h.name == "gemma").in_flight == 8
    for lease in leases:
        lease.release()
    assert next(h for h in host.hosted() if h.name == "gemma").in_flight == 0


def test_an_idle_model_goes_after_its_keep_alive_and_never_while_in_use(
    make_host: Callable[..., ModelHost],
) -> None:
    host = make_host(default_keep_s=3.0)  # long enough that a busy machine reads the countdown
    lease = host.acquire("smol")
    time.sleep(3.5)  # longer than its keep-alive, but it is in use
    assert loaded(host) == ["smol"]
    (h,) = host.hosted()
    assert h.in_flight == 1 and h.expires_in_s is None
    lease.release()
    (h,) = host.hosted()
    assert h.expires_in_s is not None and 0 < h.expires_in_s <= 3.0
    assert until(lambda: loaded(host) == [], 10)

    # keep 0 (Ollama's keep_alive: 0): gone as soon as the last request ends.
    a = host.acquire("smol", keep_s=0)
    b = host.acquire("smol")
    a.release()
    time.sleep(0.3)
    assert loaded(host) == ["smol"]  # b still holds it
    b.release()
    assert until(lambda: loaded(host) == [], 10)

    # None (keep_alive: -1): stays.
    host.acquire("smol", keep_s=None).release()
    time.sleep(1.5)
    assert loaded(host) == ["smol"] and host.hosted()[0].expires_in_s is None


def test_a_pinned_model_stays(make_host: Callable[..., ModelHost]) -> None:
    host = make_host(default_keep_s=0.5)
    host.acquire("smol").release()
    host.pin("smol")
    time.sleep(1.0)
    assert loaded(host) == ["smol"] and host.hosted()[0].pinned
    host.pin("smol", False)  # its keep-alive counts from now
    assert until(lambda: loaded(host) == [], 10)


def test_the_least_recently_used_idle_model_makes_room(
    make_host: Callable[..., ModelHost], specs: dict[str, Loadable]
) -> None:
    # Room for Gemma and one SmolLM2, not for all three.
    budget = room_for_gemma_and_one_smol(specs)
    host = make_host(budget_mib=budget)
    host.acquire("smol").release()
    host.acquire("gemma").release()
    host.acquire("smol").release()  # used after Gemma: Gemma is now the least recent
    assert loaded(host) == ["gemma", "smol"]
    with host.acquire("copy"):
        assert loaded(host) == ["copy", "smol"]
    used = host.used()["CPU"]
    assert used <= budget * MiB
    # What the budget counts is what llama.cpp allocated, once loaded.
    assert used == sum(host.get(n).memory_actual.devices["CPU"] for n in ("copy", "smol"))


def test_no_room_is_a_refusal_with_the_reason(
    make_host: Callable[..., ModelHost], specs: dict[str, Loadable]
) -> None:
    half = need_mib(specs["gemma"]) // 2
    small = make_host(budget_mib=half)
    with pytest.raises(NoRoom) as e:
        small.acquire("gemma")
    msg = str(e.value)
    assert re.fullmatch(
        rf"loading Gemma 3 270M needs \d+ MiB of RAM; {half} MiB free of the "
        rf"{half} MiB budget; every loaded model is busy, pinned or held by a "
        r"client",
        msg,
    ), msg
    assert loaded(small) == [] and small.hosted() == []

    # Busy models are not evicted: the request is refused, they go on.
    host = make_host(budget_mib=room_for_gemma_and_one_smol(specs))
    with host.acquire("smol") as smol, host.acquire("gemma"):
        with pytest.raises(NoRoom, match="busy, pinned or held by a client"):
            host.acquire("copy")
        assert loaded(host) == ["gemma", "smol"]
        assert smol.model.generate(HI, TWO).consume()


def test_a_model_a_client_holds_is_never_evicted(
    make_host: Callable[..., ModelHost], specs: dict[str, Loadable]
) -> None:
    host = make_host(budget_mib=room_for_gemma_and_one_smol(specs))
    chat = Model(specs["gemma"].path, PARAMS)
    host.add("chat-model", chat, owner="chat")
    host.acquire("smol").release()
    host.acquire("copy").release()  # SmolLM2 goes to make room, not the chat's model
    assert loaded(host) == ["chat-model", "copy"]
    assert next(h for h in host.hosted() if h.name == "chat-model").owner == "chat"
    host.remove("chat-model")
    chat.close()


def test_a_file_that_fails_to_load_fails_its_requests_only(
    make_host: Callable[..., ModelHost], specs: dict[str, Loadable], tmp_path: Path
) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(specs["smol"].path.read_bytes()[: 4 << 20])  # cut short
    catalog = [*specs.values(), Loadable("broken", bad, PARAMS)]
    host = ModelHost(lambda: catalog)
    try:
        host.acquire("smol").release()
        errors: list[BaseException] = []

        def ask() -> None:
            try:
                host.acquire("broken").release()
            except EngineError as e:
                errors.append(e)

        threads = [threading.Thread(target=ask) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(errors) == 3 and len({str(e) for e in errors}) == 1
        assert "\n" not in str(errors[0]) and str(errors[0])
        assert loaded(host) == ["smol"]
        with host.acquire("smol") as lease:
            assert lease.model.generate(HI, TWO).consume()
    finally:
        host.close()


def test_budgets_are_checked() -> None:
    with pytest.raises(EngineError, match="must not be negative"):
        MemoryBudget({"CPU": -1})
    assert MemoryBudget({"CPU": 2 * GiB}).devices["CPU"] == 2 * GiB


def test_a_client_hands_over_a_model_other_clients_use(
    make_host: Callable[..., ModelHost], specs: dict[str, Loadable]
) -> None:
    """The chat switching models: its old model stays for the API's requests (and goes after
    the keep-alive once they are done); one nobody else used is the client's to free."""
    host = make_host(default_keep_s=1.0)
    unused = Model(specs["copy"].path, PARAMS)
    host.add("unused", unused, owner="chat")
    assert not host.hand_over("unused")  # nobody else asked for it
    assert host.owner_of("unused") == "chat"
    host.remove("unused")
    unused.close()

    chat = Model(specs["smol"].path, PARAMS)
    host.add("chat-model", chat, owner="chat")
    request = host.acquire("chat-model")  # an API request in flight
    assert host.hand_over("chat-model")
    (h,) = host.hosted()
    assert h.owner is None and h.keep_s == 1.0 and h.expires_in_s is None  # still in use
    time.sleep(1.3)
    assert loaded(host) == ["chat-model"]  # never while a request holds it
    assert request.model.generate(HI, TWO).consume()
    request.release()
    assert until(lambda: loaded(host) == [], 10)  # then its keep-alive runs out

    # Answered requests before the switch count as using it too.
    again = Model(specs["smol"].path, PARAMS)
    host.add("chat-model", again, owner="chat")
    host.acquire("chat-model").release()
    assert host.hand_over("chat-model") and host.owner_of("chat-model") is None
    assert until(lambda: loaded(host) == [], 10)


def test_a_client_takes_the_model_the_host_loaded_instead_of_a_copy(
    make_host: Callable[..., ModelHost], specs: dict[str, Loadable]
) -> None:
    host = make_host(loader=(loader := Counting()))
    seen: list[tuple[str, bool]] = []
    host.on_change(lambda name, model: seen.append((name, model is not None)))
    host.acquire("smol").release()
    claimed = host.claim(specs["smol"].path, owner="chat", params=PARAMS)
    assert claimed is not None and claimed[0] == "smol"
    assert claimed[1] is host.get("smol") and loader.loads == {"smol": 1}
    (h,) = host.hosted()
    assert h.owner == "chat" and h.keep_s is None and h.expires_in_s is None
    assert seen == [("smol", True), ("smol", True)]  # listeners hear it changed hands
    assert host.claim(specs["smol"].path, owner="bench") is None  # a client's already
    assert host.claim(specs["gemma"].path) is None  # not loaded here: the client loads it

    # Loaded with other settings and idle: unloaded, so the client's load has the room.
    host.acquire("copy").release()
    other = LoadParams(n_ctx=1024, n_threads=2)
    assert host.claim(specs["copy"].path, owner="chat", params=other) is None
    assert loaded(host) == ["smol"]
    host.remove("smol")
    claimed[1].close()


def test_a_client_load_makes_room_by_evicting_idle_models(
    make_host: Callable[..., ModelHost], specs: dict[str, Loadable]
) -> None:
    host = make_host(budget_mib=1100)
    host.acquire("gemma").release()
    host.acquire("smol").release()
    assert host.make_room(specs["copy"]) is None  # all three do not fit: Gemma goes
    assert loaded(host) == ["smol"]

    small = make_host(budget_mib=900)
    with small.acquire("smol"):  # busy: it stays, and the client hears why it won't fit
        short = small.make_room(specs["gemma"])
    assert short is not None and re.fullmatch(
        r"loading Gemma 3 270M needs \d+ MiB of RAM; \d+ MiB free of the 900 MiB budget; "
        r"every loaded model is busy, pinned or held by a client",
        short,
    ), short
    assert loaded(small) == ["smol"]


def test_a_model_with_a_request_in_flight_is_not_unloaded(
    make_host: Callable[..., ModelHost],
) -> None:
    host = make_host(default_keep_s=None)
    lease = host.acquire("smol")
    reply = lease.model.generate(HI, SamplingParams(max_tokens=8, temperature=0))
    with pytest.raises(ModelBusy, match=r"^smol cannot be unloaded: 1 request in flight$"):
        host.unload("smol")
    reply.consume()
    assert reply.stats.stop_reason in ("stop", "length")  # on the context still there
    assert loaded(host) == ["smol"]
    lease.release()
    host.unload("smol")
    assert loaded(host) == []

    # Closing the host leaves a busy model to its last request, which unloads it.
    lease = host.acquire("smol")
    host.close()
    assert loaded(host) == ["smol"]
    late = lease.model.generate(HI, TWO)
    late.consume()
    assert late.stats.stop_reason in ("stop", "length")
    lease.release()
    assert loaded(host) == []
