"""The model host: the one owner of the models loaded in a process, by name.

Every client finds a model here: the desktop chat (the engine thread loads into it), the
desktop's local server, `candlewick serve`, `candlewick run`. A loaded model has one llama.cpp
context and one decode loop (`Model.loop`); requests go there.

Several models can be loaded at once, within a memory budget per device:

- A client `acquire`s a model by name (id, alias, file name); one the host knows from its
  catalog but has not loaded is loaded on demand, with the catalog's load settings. Requests
  arriving while it loads wait for that one load.
- Before a load the memory estimate decides whether it fits; if not, the least recently used
  idle model the host loaded itself is unloaded first, and when nothing can go the request is
  refused with the reason (`NoRoom`), never by running out of memory. After a load the
  budget counts what llama.cpp really allocated, plus the whole RAM its prompt cache may grow
  to; clients are shown what it takes now (`engine.host.budget`).
- A model the host loaded stays for its keep-alive time after its last request (default 5
  minutes; 0 = unload when idle, None = keep), unless pinned. A model with a request in flight
  is never unloaded: `unload` refuses it (freeing it would pull the context and vocabulary
  from under the request's threads), and `close` leaves it to its last request. A model a
  client added itself (the chat's) is that client's: the host neither evicts nor frees it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.errors import EngineError
from engine.host.attachments import Attachments
from engine.host.budget import (
    MemoryBudget,
    Need,
    Planner,
    actual_memory,
    reserved_memory,
    total_memory,
)
from engine.host.host_entry import Entry, HostedModel, Listener, Listeners, matches
from engine.host.keep_alive import Reaper
from engine.host.runtime import Model
from engine.settings import LoadParams

log = logging.getLogger("candlewick.host")
DEFAULT_KEEP_S = 300.0  # how long a model loaded on demand stays idle (Ollama's default)


class ModelNotLoaded(EngineError):
    """No model of that name is loaded."""


class ModelNotFound(EngineError):
    """No model of that name is loaded or known; `names` lists those that are."""

    def __init__(self, message: str, names: Sequence[str]) -> None:
        super().__init__(message)
        self.names = list(names)


class NoRoom(EngineError):
    """A load would not fit the memory budget and nothing can be unloaded to make room."""


class ModelBusy(EngineError):
    """The model cannot be unloaded now (a client holds it)."""


@dataclass(frozen=True)
class Loadable:
    """A model the host may load on demand: what clients call it and how to load it."""

    name: str  # the id clients use
    path: Path
    params: LoadParams
    aliases: tuple[str, ...] = ()
    title: str = ""  # its name for people (messages); default: `name`


def estimate_need(spec: Loadable) -> Need:
    """The memory estimate of `engine.memory` for this file and these settings."""
    from engine.memory.estimate import estimate
    from engine.memory.params import EstimateParams

    est = estimate(spec.path, EstimateParams(spec.params))
    # The margin kept free on a device is the machine's, not each model's: the budget counts
    # what the model takes, and `fits` (free memory, margin included) decides without one.
    return Need(
        {d.name: d.bytes + d.overhead_bytes for d in est.devices}, None if est.fits else est.reason
    )


def load_model(spec: Loadable) -> Model:
    return Model(spec.path, spec.params)


class Unset:
    """No value given (None means "keep forever")."""


UNSET = Unset()


class Lease:
    """A hold on a loaded model: while any lease is held the host does not unload it.
    `release()` (or leaving the `with`) is idempotent."""

    def __init__(self, host: ModelHost, entry: Entry) -> None:
        self._host = host
        self._entry = entry
        self._released = False
        assert entry.model is not None
        self.model: Model = entry.model
        self.name = entry.name

    def release(self, keep_s: float | Unset | None = UNSET) -> None:
        """`keep_s`: how long the model stays once idle from now on (Ollama's keep_alive)."""
        if self._released:
            return
        self._released = True
        self._host._release(self._entry, keep_s)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class ModelHost:
    """`catalog`: the models that may be loaded on demand (called on each lookup, so a
    library that changes is seen); `budget`: per-device limits (None: the machine's free
    memory, as the estimate reads it); `estimator`/`loader`: how a load is planned and done
    (tests pass their own to simulate devices)."""

    def __init__(
        self,
        catalog: Callable[[], Sequence[Loadable]] = tuple,
        budget: MemoryBudget | None = None,
        *,
        estimator: Callable[[Loadable], Need] = estimate_need,
        loader: Callable[[Loadable], Model] = load_model,
        default_keep_s: float | None = DEFAULT_KEEP_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._catalog = catalog
        self._planner = Planner(budget)
        self._estimator = estimator
        self._loader = loader
        self.default_keep_s = default_keep_s
        self._clock = clock
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._load_lock = threading.Lock()  # one load at a time: each plans with the last's
        self._entries: list[Entry] = []
        self._listeners = Listeners()
        self._reaper: Reaper | None = None
        self._closed = False
        self.loads = 0  # loads done on demand (what tests and /metrics count)
        # What clients keep about each model (the server's handles), gone with the model.
        self.attachments = Attachments(self._lock, lambda: self._entries, self._loaded_entry)

    # -- models clients load themselves ----------------------------------------------------

    def add(
        self, name: str, model: Model, *, owner: str = "client", aliases: Sequence[str] = ()
    ) -> None:
        """Make a model the caller loaded available as `name`. It stays the caller's: the
        host never unloads it; the caller `remove`s it (a file is loaded once: the same
        model may not be added under a second name)."""
        with self._lock:
            for e in self._entries:
                if e.model is model and e.name != name:
                    raise EngineError(f"{model.path.name} is already loaded as {e.name!r}")
                if e.name == name and e.model is not model:
                    raise EngineError(f"a model named {name!r} is already loaded")
            if any(e.model is model for e in self._entries):
                return
            entry = Entry(
                name,
                model.path,
                tuple(aliases),
                name,
                model,
                owner=owner,
                keep_s=None,
                last_used=self._clock(),
                loaded_at=time.time(),
                memory=reserved_memory(model),
            )
            self._entries.append(entry)
        self._listeners.tell(name, model)

    def hand_over(self, name: str) -> bool:
        """The client that added `name` is done with it (the chat switches models). If
        other clients use it (a request in flight, or it has answered API requests since it
        was added) the host takes it: from now on it is unloaded after the host's keep-alive
        once idle, or evicted for room, like a model loaded on demand, and True is returned.
        False: nobody else used it; the caller `remove`s and frees it as before."""
        with self._changed:
            e = self._find(name)
            if e is None or e.model is None or e.owner is None:
                return False
            if e.in_flight == 0 and e.served == 0:
                return False
            log.info("%s stays loaded for the clients using it (owner %s left)", e.name, e.owner)
            e.owner, e.keep_s, e.expires_at = None, self.default_keep_s, None
            if e.in_flight == 0:
                e.idle_from(self._clock())
            self._changed.notify_all()
        self._ensure_reaper()
        return True

    def claim(
        self, path: Path, *, owner: str = "client", params: LoadParams | None = None
    ) -> tuple[str, Model] | None:
        """A client is about to load `path`: if the host already has it loaded on demand,
        the client takes that model instead (a file is loaded once): it becomes the
        client's, kept until the client `remove`s it. Returns its name and the model, or
        None (not loaded here, held by another client, or loaded with other `params` and
        idle, in which case it is unloaded first so the client's load has the room). A
        context with more or longer sequences than `params` asks for serves as well. A
        model being loaded is waited for."""
        with self._changed:
            e = next(
                (x for x in self._entries if x.path is not None and _same_file(x.path, path)), None
            )
            if e is None or e.owner is not None:
                return None
            e.in_flight += 1  # not unloaded while it loads or while this decides
        try:
            e.wait_loaded(self._changed, None, self._clock)
        except EngineError:
            return None
        finally:
            with self._changed:
                e.in_flight -= 1
                self._changed.notify_all()
        assert e.model is not None
        if params is not None and not _serves(e.model, params):
            if e.evictable:
                self._evict(e)
                return None
            log.info("%s is busy with other settings; the %s uses it as loaded", e.name, owner)
        with self._changed:
            if e not in self._entries or e.owner is not None or e.model is None:
                return None
            e.owner, e.keep_s, e.expires_at = owner, None, None
            e.served = 0
            self._changed.notify_all()
            model = e.model
        self._listeners.tell(e.name, model)  # it is a client's model now, as if just added
        return e.name, model

    def make_room(self, spec: Loadable) -> str | None:
        """Before a client loads `spec` itself: unload least recently used idle models the
        host loaded until the estimate fits. Returns why it still does not fit (the client
        decides whether to load anyway), or None."""
        probe = Entry(spec.name, spec.path)
        with self._load_lock:
            try:
                self._make_room(spec, probe)
            except NoRoom as e:
                return str(e)
            except Exception as e:  # a file the estimate cannot read: the load says why
                log.info("no estimate for %s: %s", spec.name, e)
        return None

    def add_alias(self, name: str, alias: str) -> None:
        """Let the loaded model `name` answer to `alias` too."""
        with self._lock:
            e = self._loaded_entry(name)
            if alias not in e.aliases:
                e.aliases = (*e.aliases, alias)

    def get(self, name: str) -> Model:
        """The loaded model called `name` (no load on demand, no hold)."""
        with self._lock:
            e = self._find(name)
            names = [x.name for x in self._entries if x.model is not None]
        if e is None or e.model is None:
            loaded = f"loaded: {', '.join(sorted(names))}" if names else "no model is loaded"
            raise ModelNotLoaded(f"model {name!r} is not loaded ({loaded})")
        return e.model

    def owner_of(self, name: str) -> str | None:
        """The client that holds the model `name` (None: the host, or no such model)."""
        with self._lock:
            e = self._find(name)
            return e.owner if e is not None else None

    def names(self) -> list[str]:
        """The loaded models' names."""
        with self._lock:
            return sorted(e.name for e in self._entries if e.model is not None)

    def remove(self, name: str) -> Model | None:
        """Forget `name` (the caller frees the model); listeners hear it is gone first."""
        with self._changed:
            e = self._find(name)
            if e is None or e.model is None:
                return None
            self._entries.remove(e)
            self._changed.notify_all()
        self._listeners.tell(e.name, None)
        e.close_attached()
        return e.model

    def unload(self, name: str) -> None:
        """Free `name` now. Refused with ModelBusy while requests hold it (`set_keep(name, 0)`
        unloads it as soon as they end)."""
        with self._changed:
            e = self._find(name)
            if e is None or e.model is None:
                return
            if e.in_flight:
                n = e.in_flight
                raise ModelBusy(
                    f"{e.title} cannot be unloaded: {n} request{'s' if n != 1 else ''} in flight"
                )
            self._entries.remove(e)
            self._changed.notify_all()
        self._listeners.tell(e.name, None)
        e.close_attached()
        e.model.close()

    def on_change(self, fn: Listener) -> Callable[[], None]:
        """Call `fn(name, model)` when a model is added, loaded or claimed by a client (see
        `owner_of`), `fn(name, None)` before one goes (on the thread that adds or removes
        it). Returns the call that stops it."""
        return self._listeners.subscribe(fn)

    # -- models loaded on demand -----------------------------------------------------------

    def known(self) -> list[Loadable]:
        """Every model that may be asked for: the catalog's, and loaded ones it lacks."""
        specs = list(self._catalog())
        with self._lock:
            for e in self._entries:
                if e.path is not None and not any(s.path == e.path for s in specs):
                    specs.append(Loadable(e.name, e.path, LoadParams(), e.aliases, e.title))
        return specs

    def resolve(self, name: str) -> str:
        """The id of the model `name` refers to, loaded or not; ModelNotFound if none."""
        with self._lock:
            e = self._find(name)
            if e is not None:
                return e.name
        return self.find(name).name

    def acquire(
        self, name: str, *, keep_s: float | Unset | None = UNSET, timeout_s: float | None = None
    ) -> Lease:
        """Hold the model `name`, loading it first if it is known but not loaded. Raises
        ModelNotFound, NoRoom, or the load's own error (for every request that waited)."""
        deadline = None if timeout_s is None else self._clock() + timeout_s
        with self._changed:
            e = self._find(name)
            if e is not None:
                self._hold(e, keep_s)
        if e is None:
            spec = self.find(name)
            e = self._start_load(spec, keep_s)
        try:
            e.wait_loaded(self._changed, deadline, self._clock)
        except BaseException:
            with self._changed:
                e.in_flight -= 1
                self._changed.notify_all()
            raise
        return Lease(self, e)

    def acquire_ready(self, name: str, *, keep_s: float | Unset | None = UNSET) -> Lease | None:
        """Hold the model `name` if it is loaded (never waits); None if it is not."""
        with self._changed:
            e = self._find(name)
            if e is None or e.model is None:
                return None
            self._hold(e, keep_s)
        return Lease(self, e)

    def _hold(self, e: Entry, keep_s: float | Unset | None) -> None:
        """One more request holds `e` (call with the lock held)."""
        e.in_flight += 1
        e.served += 1
        if not isinstance(keep_s, Unset) and e.owner is None:
            e.keep_s = keep_s

    def find(self, name: str) -> Loadable:
        """The catalog's model that `name` refers to (not loading it); ModelNotFound lists
        the names there are."""
        specs = list(self._catalog())
        for s in specs:
            if matches(name, s.name, s.aliases, s.path):
                return s
        with self._lock:
            loaded = [e.name for e in self._entries]
        names = sorted({*loaded, *(s.name for s in specs)})
        listed = ", ".join(names) if names else "none"
        raise ModelNotFound(f"model {name!r} not found; available: {listed}", names)

    def _start_load(self, spec: Loadable, keep_s: float | Unset | None) -> Entry:
        with self._changed:
            e = self._find(spec.name)
            if e is not None:  # another request started it meanwhile
                self._hold(e, keep_s)
                return e
            e = Entry(
                spec.name,
                spec.path,
                spec.aliases,
                spec.title or spec.name,
                keep_s=self.default_keep_s if isinstance(keep_s, Unset) else keep_s,
                in_flight=1,
                served=1,
            )
            self._entries.append(e)
        threading.Thread(
            target=self._load, args=(e, spec), name=f"candlewick-load-{spec.name}", daemon=True
        ).start()
        return e

    def _load(self, e: Entry, spec: Loadable) -> None:
        try:
            with self._load_lock:
                self._make_room(spec, e)
                log.info("loading %s from %s", spec.name, spec.path.name)
                t0 = time.perf_counter()
                model = self._loader(spec)
                log.info("loaded %s in %.2f s", spec.name, time.perf_counter() - t0)
            with self._changed:
                e.model = model
                e.memory = reserved_memory(model) or e.memory
                e.loaded_at = time.time()
                e.last_used = self._clock()
                self.loads += 1
                self._changed.notify_all()
                closed = self._closed
            self._ensure_reaper()
            self._listeners.tell(e.name, model)
            if closed:  # its waiters still hold it: then their last release unloads it
                with contextlib.suppress(ModelBusy):
                    self.unload(e.name)
        except BaseException as err:
            log.info("could not load %s: %s", spec.name, err)
            with self._changed:
                e.error = (
                    err
                    if isinstance(err, EngineError)
                    else EngineError(f"could not load {spec.title or spec.name}: {err}")
                )
                with contextlib.suppress(ValueError):
                    self._entries.remove(e)
                self._changed.notify_all()

    def _make_room(self, spec: Loadable, e: Entry) -> None:
        """Unload least recently used idle models until the load fits, or raise NoRoom."""
        title = spec.title or spec.name
        while True:
            need = self._planner.need(spec.path, spec.params, lambda: self._estimator(spec))
            with self._lock:
                e.memory = dict(need.devices)
                short = self._planner.shortfall(
                    need, (x.memory for x in self._entries if x is not e)
                )
                if short is None:
                    return
                idle = sorted((x for x in self._entries if x.evictable), key=lambda x: x.last_used)
                victim = idle[0] if idle else None
            if victim is None:
                raise NoRoom(
                    f"loading {title} {short}; every loaded model is busy, pinned "
                    "or held by a client"
                )
            self._evict(victim)

    def _evict(self, victim: Entry) -> None:
        with self._changed:
            if not victim.evictable or victim not in self._entries:
                return
            log.info("unloading %s (idle %.0f s)", victim.name, self._clock() - victim.last_used)
            self._entries.remove(victim)
            self._changed.notify_all()
        self._listeners.tell(victim.name, None)
        victim.close_attached()
        assert victim.model is not None
        victim.model.close()

    def _release(self, e: Entry, keep_s: float | Unset | None) -> None:
        with self._changed:
            e.in_flight -= 1
            if not isinstance(keep_s, Unset) and e.owner is None:
                e.keep_s = keep_s
            if e.in_flight == 0:
                e.idle_from(self._clock())
            self._changed.notify_all()
            closing = self._closed and e.in_flight == 0 and e in self._entries
        if closing:  # the host closed while this request ran: it was left for now
            with contextlib.suppress(ModelBusy):
                self.unload(e.name)

    # -- what a client may set -------------------------------------------------------------

    def pin(self, name: str, pinned: bool = True) -> None:
        with self._changed:
            e = self._loaded_entry(name)
            e.pinned = pinned
            if not pinned and e.in_flight == 0 and e.keep_s is not None:
                e.expires_at = self._clock() + e.keep_s
            self._changed.notify_all()

    def set_keep(self, name: str, keep_s: float | None) -> None:
        """How long the model stays once idle, from now (0: unload it as soon as it is)."""
        with self._changed:
            e = self._loaded_entry(name)
            if e.owner is not None:
                raise ModelBusy(f"{e.title} is held by the {e.owner}; it stays while it is")
            e.keep_s = keep_s
            e.expires_at = None if keep_s is None else self._clock() + keep_s
            self._changed.notify_all()

    def wait_unloaded(self, name: str, timeout_s: float) -> bool:
        """Wait until no model called `name` is loaded; False if one still is."""
        deadline = self._clock() + timeout_s
        with self._changed:
            while self._find(name) is not None:
                left = deadline - self._clock()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def _loaded_entry(self, name: str) -> Entry:
        e = self._find(name)
        if e is None or e.model is None:
            raise ModelNotLoaded(f"model {name!r} is not loaded")
        return e

    def hosted(self) -> list[HostedModel]:
        now = self._clock()
        with self._lock:
            return [_in_use(e.view(now), e) for e in self._entries]

    def used(self) -> dict[str, int]:
        """Bytes per device the loaded (and loading) models are counted as taking when a load
        is planned: their prompt caches' whole budgets included (`budget.reserved_memory`)."""
        with self._lock:
            return total_memory(e.memory for e in self._entries)

    # -- unloading idle models -------------------------------------------------------------

    def _ensure_reaper(self) -> None:
        with self._lock:
            if self._reaper is None and not self._closed:
                self._reaper = Reaper(
                    self._changed,
                    lambda: self._entries,
                    self._evict,
                    self._clock,
                    lambda: self._closed,
                )

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()
            reaper, self._reaper = self._reaper, None
        if reaper is not None:
            reaper.join(10)
        with self._load_lock:  # a load in progress finishes (and then sees it is closed)
            pass
        for name in self.names():
            with contextlib.suppress(ModelBusy):  # unloaded when its last request ends
                self.unload(name)

    def _find(self, name: str) -> Entry | None:
        exact = next((e for e in self._entries if e.name == name), None)
        return exact or next((e for e in self._entries if e.answers_to(name)), None)


def _in_use(view: HostedModel, e: Entry) -> HostedModel:
    """`view` with what its model takes now (`budget.actual_memory`: its prompt cache's
    current bytes, not the budget the host plans with); while it loads, the estimate."""
    now = actual_memory(e.model) if e.model is not None else {}
    return dataclasses.replace(view, memory=now) if now else view


def _serves(model: Model, params: LoadParams) -> bool:
    """Whether `model` is loaded as `params` asks, or with more room: the context's shape
    changes while a server leases its slots; every other setting must be the same."""
    same_shape = dataclasses.replace(model.params, n_ctx=params.n_ctx, n_seq_max=params.n_seq_max)
    per_seq = params.n_ctx // max(params.n_seq_max, 1)
    return same_shape == params and model.n_ctx_seq >= per_seq


def _same_file(a: Path, b: Path) -> bool:
    if a == b:
        return True
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


__all__ = [
    "DEFAULT_KEEP_S",
    "UNSET",
    "Lease",
    "Loadable",
    "ModelBusy",
    "ModelHost",
    "ModelNotFound",
    "ModelNotLoaded",
    "NoRoom",
    "Unset",
    "estimate_need",
    "load_model",
]
