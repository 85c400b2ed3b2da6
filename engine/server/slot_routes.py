"""`GET /slots`, every slot in llama-server's shape (`server_slot::to_json`: the request it
serves, its prompt and sampling, its tokens so far), and
`POST /slots/{id}?action=save|restore|erase`: a slot's prompt KV state kept in a file and
brought back, as llama-server does with `--slot-save-path` (its shapes: `{id_slot, filename,
n_saved, n_written, timings}`...). Without the option every action is a 501, as there.

The state is llama.cpp's sequence state of the slot's cells, taken and set on the model's
decode thread between two steps (`Scheduler.with_idle_slot`); a slot serving a request is
waited for, as llama-server defers the action. The file names its model and context
(engine.server.slot_files) and is refused elsewhere. `?model=` picks the model (default: the
server's)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engine.errors import EngineError
from engine.files import write_bytes_atomic
from engine.host.slots import KvLayout, Slot, SlotBusy
from engine.media.prompt import is_placeholder
from engine.server.engine_state import ServedModel, ServerState
from engine.server.errors import ApiError
from engine.server.parsing import read_json
from engine.server.protocol.infill import (
    SlotErased,
    SlotFileRequest,
    SlotNextToken,
    SlotRestored,
    SlotRestoreTimings,
    SlotSaved,
    SlotSaveTimings,
    SlotState,
)
from engine.server.protocol.llama_utility import SamplingDefaults
from engine.server.protocol.parse import parse_body
from engine.server.slot_files import (
    SlotFileError,
    SlotIdentity,
    check_identity,
    decode,
    encode,
    slot_path,
)
from engine.settings import SamplingParams

T = TypeVar("T")
BUSY_POLL_S = 0.05  # how often a busy slot is looked at again
ACTIONS = ("save", "restore", "erase")
LIST_QUERY = ("model", "fail_on_no_slot")


def identity(loaded: ServedModel) -> SlotIdentity:
    p = loaded.model.params
    return SlotIdentity(
        model=loaded.model_id,
        model_digest=loaded.digest,
        n_ctx_seq=loaded.scheduler.n_ctx_seq,
        type_k=p.type_k,
        type_v=p.type_v,
    )


def slot_state(loaded: ServedModel, s: dict[str, Any], n_ctx: int) -> SlotState:
    """One slot of the scheduler's snapshot (`Slot.summary`) in llama-server's shape."""
    out = SlotState(id=s["id"], n_ctx=n_ctx, speculative=s["speculative"], is_processing=False)
    if not s["busy"]:
        return out
    prompt: list[int] = s["prompt"]
    sampling: SamplingParams = s["sampling"]
    out.is_processing = True
    out.id_task = s["request"]
    out.n_prompt_tokens = len(prompt)
    out.n_prompt_tokens_cache = s["prompt_cached"]
    out.n_prompt_tokens_processed = len(prompt) - s["prompt_cached"] - s["prompt_pending"]
    out.params = SamplingDefaults.of(sampling, stream=s["stream"])
    out.next_token = [
        SlotNextToken(
            has_next_token=True,
            has_new_line="\n" in s["text"],
            n_remain=max(sampling.max_tokens - s["n_decoded"], 0),
            n_decoded=s["n_decoded"],
        )
    ]
    # As llama-server detokenizes it: special tokens' text included (media rows are none).
    model = loaded.model
    raw = b"".join(model.token_bytes(t, special=True) for t in prompt if not is_placeholder(t))
    out.prompt = raw.decode("utf-8", errors="replace")
    out.generated = s["text"]
    return out


class SlotRoutes:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    def routes(self) -> list[Route]:
        return [
            Route("/slots", self.list, methods=["GET"]),
            Route("/slots/{id_slot}", self.action, methods=["POST"]),
        ]

    async def list(self, request: Request) -> Response:
        """GET /slots: every slot of the model in llama-server's shape; with
        `?fail_on_no_slot=1`, a 503 while none is idle (as llama-server answers it)."""
        query = request.query_params
        for key in query:
            if key not in LIST_QUERY:
                raise ApiError(
                    400,
                    f"'{key}' is not a parameter of GET /slots (it takes model and "
                    "fail_on_no_slot)",
                    param=key,
                )
        loaded = await self.state.acquire(query.get("model"), generate=False)
        snap = loaded.scheduler.snapshot()
        if query.get("fail_on_no_slot") not in (None, "", "0", "false") and all(
            s["busy"] for s in snap.slots
        ):
            raise ApiError(503, "no slot available", code="unavailable_error")
        n_ctx = loaded.scheduler.n_ctx_seq
        slots = [slot_state(loaded, s, n_ctx) for s in snap.slots]
        return JSONResponse([s.wire() for s in slots])

    async def action(self, request: Request) -> Response:
        folder = self.state.config.slot_save_path
        if folder is None:
            raise ApiError(
                501,
                "this server does not keep slot files: start it with --slot-save-path DIR",
                code="not_supported",
            )
        try:
            seq = int(request.path_params["id_slot"])
        except ValueError:
            raise ApiError(400, "invalid slot id: give a number", param="id_slot") from None
        action = request.query_params.get("action", "")
        if action not in ACTIONS:
            raise ApiError(400, "invalid action: save, restore or erase", param="action")
        loaded = await self.state.acquire(request.query_params.get("model"))
        if action == "erase":
            n = await self._on_slot(loaded, seq, lambda layout, slot: layout.erase(slot))
            return JSONResponse(SlotErased(id_slot=seq, n_erased=n).wire())
        body = await read_json(request, self.state.config.max_body_bytes)
        filename = parse_body(SlotFileRequest, body).filename
        try:
            path = slot_path(folder, filename)
        except SlotFileError as e:
            raise ApiError(400, str(e), param="filename") from None
        if action == "save":
            return await self._save(loaded, seq, filename, path)
        return await self._restore(loaded, seq, filename, path)

    async def _save(self, loaded: ServedModel, seq: int, filename: str, path: Path) -> Response:
        t0 = time.perf_counter()
        tokens, state = await self._on_slot(
            loaded, seq, lambda layout, slot: (list(slot.tokens), layout.export(slot))
        )
        data = encode(identity(loaded), tokens, state)
        try:
            await asyncio.to_thread(write_bytes_atomic, path, data)
        except OSError as e:
            raise ApiError(500, f"cannot write {filename}: {e.strerror or e}") from None
        answer = SlotSaved(
            id_slot=seq,
            filename=filename,
            n_saved=len(tokens),
            n_written=len(data),
            timings=SlotSaveTimings(save_ms=(time.perf_counter() - t0) * 1000),
        )
        return JSONResponse(answer.wire())

    async def _restore(self, loaded: ServedModel, seq: int, filename: str, path: Path) -> Response:
        t0 = time.perf_counter()
        try:
            data = await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:
            raise ApiError(400, f"there is no slot file {filename}", param="filename") from None
        except OSError as e:
            raise ApiError(400, f"cannot read {filename}: {e.strerror or e}") from None
        try:
            saved = decode(data, filename)
            check_identity(saved.identity, identity(loaded), filename)
        except SlotFileError as e:
            raise ApiError(400, str(e), param="filename") from None
        n_ctx, n_vocab = loaded.scheduler.n_ctx_seq, loaded.model.n_vocab
        if len(saved.tokens) >= n_ctx:
            raise ApiError(
                400, f"{filename} holds {len(saved.tokens)} tokens; a slot holds {n_ctx}"
            )
        if any(not 0 <= t < n_vocab for t in saved.tokens):
            raise ApiError(400, f"{filename} holds tokens this model's vocabulary does not have")
        await self._on_slot(
            loaded, seq, lambda layout, slot: layout.load(slot, saved.tokens, saved.state)
        )
        answer = SlotRestored(
            id_slot=seq,
            filename=filename,
            n_restored=len(saved.tokens),
            n_read=len(data),
            timings=SlotRestoreTimings(restore_ms=(time.perf_counter() - t0) * 1000),
        )
        return JSONResponse(answer.wire())

    async def _on_slot(self, loaded: ServedModel, seq: int, fn: Callable[[KvLayout, Slot], T]) -> T:
        """`fn` on the slot once it serves no request (llama-server defers the action too),
        within the server's request timeout."""
        deadline = time.monotonic() + self.state.config.request_timeout_s
        while True:
            try:
                return await asyncio.to_thread(loaded.scheduler.with_idle_slot, seq, fn)
            except SlotBusy:
                if time.monotonic() > deadline:
                    raise ApiError(
                        503, f"slot {seq} stayed busy", headers={"Retry-After": "1"}
                    ) from None
                await asyncio.sleep(BUSY_POLL_S)
            except EngineError as e:
                raise ApiError(400, str(e)) from None
