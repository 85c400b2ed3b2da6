"""The desktop server's start racing the chat: a model the chat unloads while the server
starts is never served (the interleaving forced by a hook, on the real SmolLM2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.services.local_server import LocalServer, ServeSettings
from app.services.model_catalog import CHAT_OWNER
from engine.errors import EngineError
from engine.host.host import ModelHost
from engine.host.runtime import Model
from engine.settings import LoadParams


def test_a_model_unloaded_while_the_server_starts_is_not_served(
    smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = ModelHost()
    model = Model(smollm2_path, LoadParams(n_ctx=1024, n_threads=2))
    host.add("smol", model, owner=CHAT_OWNER)
    lease = LocalServer._lease

    def lease_then_eject(self: LocalServer, m: Model) -> None:
        lease(self, m)
        # The chat ejects its model between the server's lease and its serving it: out of
        # the host (its listeners told), to be freed by the engine thread at any moment.
        host.remove("smol")

    monkeypatch.setattr(LocalServer, "_lease", lease_then_eject)
    server = LocalServer(host, "smol", ServeSettings(port=0, parallel=1, ctx_per_slot=512))
    try:
        with pytest.raises(EngineError, match=r"^smol was unloaded while the server started$"):
            server.start()
        assert not server.running and server.state.loaded is None
        assert model.loop.leased_by is None  # the chat's context was given back
    finally:
        server.stop()
        host.close()
        model.close()
