"""Structured output: what a JSON-schema grammar costs, as ratios measured in one run
(docs/benchmarks.md, "Structured output").

    .venv/bin/python benchmarks/structured_output.py [--tokens 160] [--pairs 5]

speed    one request through the host with a JSON-schema grammar vs the same request free,
         same prompt, alternating pairs; tokens/s between first and last token (wall clock,
         so the mask's work counts). Goal: >= 0.9.
engines  the two kept grammar engines in the tightest C-API loop on the same context: no
         constraint, llguidance's mask (what the host uses), and llama.cpp's grammar sampler
         with llama-cpp-python's JSON-schema converter, on the same schema.
compile  time to turn a 30-property schema into a usable grammar: llguidance (compile +
         matcher) vs llama-cpp-python's converter + llama.cpp's grammar sampler; median of 20.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.doc_tables import machine_line  # noqa: E402
from benchmarks.host_clients import model_path  # noqa: E402
from engine.decoding import constraints  # noqa: E402
from engine.host.runtime import Model  # noqa: E402
from engine.native import llama_lib  # noqa: E402
from engine.settings import LoadParams, SamplingParams, default_threads  # noqa: E402

ASK = [{"role": "user", "content": "List twelve famous ships with a note on each."}]
# Long enough that both replies run to max_tokens: the rates compare like with like.
SHIPS = {
    "type": "object",
    "properties": {
        "ships": {
            "type": "array",
            "minItems": 12,
            "maxItems": 12,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 24},
                    "year": {"type": "integer"},
                    "note": {"type": "string", "maxLength": 80},
                },
                "required": ["name", "year", "note"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["ships"],
    "additionalProperties": False,
}


def thirty_properties() -> dict[str, Any]:
    kinds = [
        {"type": "string", "maxLength": 40},
        {"type": "integer"},
        {"type": "boolean"},
        {"type": "number"},
        {"enum": ["red", "green", "blue"]},
        {"type": "array", "items": {"type": "string"}, "maxItems": 4},
    ]
    props = {f"field_{i}": kinds[i % len(kinds)] for i in range(30)}
    return {
        "type": "object",
        "properties": props,
        "required": list(props)[:20],
        "additionalProperties": False,
    }


def host_rate(model: Model, grammar: str | None, n_tokens: int) -> tuple[float, int]:
    model.reset_cache()
    gen = model.generate(ASK, SamplingParams(temperature=0, max_tokens=n_tokens, grammar=grammar))
    gen.consume()
    return gen.stats.gen_tps_wall, gen.stats.gen_tokens


def speed(model: Model, n_tokens: int, pairs: int) -> dict[str, Any]:
    grammar = constraints.json_schema(SHIPS)
    host_rate(model, grammar, 8)  # the vocabulary's llguidance view is built once, here
    free, bound, lengths = [], [], []
    for _ in range(pairs):
        a, na = host_rate(model, None, n_tokens)
        b, nb = host_rate(model, grammar, n_tokens)
        free.append(a)
        bound.append(b)
        lengths.append((na, nb))
    ratios = [b / a for a, b in zip(free, bound, strict=True)]
    return {
        "free_tps": statistics.median(free),
        "schema_tps": statistics.median(bound),
        "ratio": statistics.median(ratios),
        "pairs": ratios,
        "tokens": lengths,
    }


def c_loop(model: Model, prompt: list[int], n_tokens: int, engine: str) -> float:
    """Greedy decode on the C API with one kind of constraint; tokens/s after the first."""
    C = llama_lib.lib()
    ctx = model.ctx_ptr
    C.llama_memory_clear(C.llama_get_memory(ctx), True)
    chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
    mask = None
    if engine == "llama.cpp":
        from llama_cpp.llama_grammar import json_schema_to_gbnf

        gbnf = json_schema_to_gbnf(json.dumps(SHIPS))
        C.llama_sampler_chain_add(
            chain, C.llama_sampler_init_grammar(model.vocab_ptr, gbnf.encode(), b"root")
        )
    elif engine == "llguidance":
        mask = model.grammar_mask(constraints.json_schema(SHIPS))
    C.llama_sampler_chain_add(chain, C.llama_sampler_init_greedy())
    arr = (C.llama_token * len(prompt))(*prompt)
    C.llama_decode(ctx, C.llama_batch_get_one(arr, len(prompt)))
    tok = (C.llama_token * 1)()
    one = C.llama_batch_get_one(tok, 1)
    n = 0
    t0 = 0.0
    for i in range(n_tokens):
        if i == 1:
            t0 = time.perf_counter()
        if mask is not None:
            logits = C.llama_get_logits_ith(ctx, -1)
            mask.apply(np.ctypeslib.as_array(logits, shape=(model.n_vocab,)))
        tok[0] = C.llama_sampler_sample(chain, ctx, -1)
        if model.is_eog(tok[0]) or (mask is not None and not mask.consume(tok[0])):
            break
        C.llama_decode(ctx, one)
        n += 1
    C.llama_synchronize(ctx)
    dt = time.perf_counter() - t0
    C.llama_sampler_free(chain)
    return (n - 1) / dt if n > 1 else 0.0


def engines(model: Model, n_tokens: int, pairs: int) -> dict[str, Any]:
    prompt = model.chat_tokens(ASK)
    out: dict[str, list[float]] = {"none": [], "llguidance": [], "llama.cpp": []}
    for _ in range(pairs):
        for name in out:
            # On the model's decode thread: a second thread calling llama_decode brings a
            # second OpenMP team onto the 2 cores (engine.host.model_build.on_passing_thread).
            out[name].append(
                model.loop.call_idle(lambda name=name: c_loop(model, prompt, n_tokens, name))
            )  # type: ignore[misc]
    med = {k: statistics.median(v) for k, v in out.items()}
    return {
        "tps": med,
        "llguidance_ratio": med["llguidance"] / med["none"],
        "llama_cpp_ratio": med["llama.cpp"] / med["none"],
    }


def compile_times(model: Model, repeats: int = 20) -> dict[str, float]:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    C = llama_lib.lib()
    schema = thirty_properties()
    t0 = time.perf_counter()
    model.grammar_mask(constraints.any_json_object())  # builds the vocabulary view if needed
    first = time.perf_counter() - t0
    llg, lcpp = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        model.grammar_mask(constraints.json_schema(schema))
        llg.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        smp = C.llama_sampler_init_grammar(
            model.vocab_ptr, json_schema_to_gbnf(json.dumps(schema)).encode(), b"root"
        )
        lcpp.append(time.perf_counter() - t0)
        C.llama_sampler_free(smp)
    return {
        "llguidance_ms": 1000 * statistics.median(llg),
        "llama_cpp_ms": 1000 * statistics.median(lcpp),
        "first_use_ms": 1000 * first,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--pairs", type=int, default=5)
    args = ap.parse_args()
    model = Model(model_path(args.model), LoadParams(n_ctx=2048, n_threads=default_threads()))
    try:
        # The vocabulary view is built once per model: time it on a fresh one.
        comp = compile_times(model)
        sp = speed(model, args.tokens, args.pairs)
        en = engines(model, args.tokens, args.pairs)
    finally:
        model.close()
    print(machine_line())
    print(
        f"speed: schema {sp['schema_tps']:.1f} vs free {sp['free_tps']:.1f} tok/s, ratio "
        f"{sp['ratio']:.3f} (pairs: {', '.join(f'{r:.3f}' for r in sp['pairs'])}; "
        f"tokens {sp['tokens']})"
    )
    t = en["tps"]
    print(
        f"engines (C-API loop): none {t['none']:.1f}, llguidance {t['llguidance']:.1f} "
        f"({en['llguidance_ratio']:.3f}), llama.cpp grammar {t['llama.cpp']:.1f} "
        f"({en['llama_cpp_ratio']:.3f}) tok/s"
    )
    print(
        f"compile, 30 properties: llguidance {comp['llguidance_ms']:.2f} ms, llama.cpp "
        f"{comp['llama_cpp_ms']:.2f} ms (median of 20); the vocabulary view on first use "
        f"{comp['first_use_ms']:.0f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
