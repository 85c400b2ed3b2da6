"""Log probabilities on the real SmolLM2, read with the official clients: every logprob and
alternative the server gives is the log-softmax of the raw logits llama.cpp computes for the
same tokens, fed through llama-cpp-python's own `Llama` here (one token a step, as the loop
decodes an answer); greedy picks the most likely token; streamed and whole answers agree."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import llama_cpp.llama_cpp as C
import numpy as np
import numpy.typing as npt
import ollama
import openai
import pytest
from llama_cpp import Llama

from engine.server import ServedModel, ServerThread
from engine.settings import use_extra_buffers
from tests.engine.server.conftest import API_KEY

TOL = 1e-4
ASK = [{"role": "user", "content": "Name three colours of the rainbow."}]
# Greedy over the raw logits: no repeat penalty (the API's default is 1.1), so the token
# handed out is the most likely one.
RAW = {"repeat_penalty": 1.0}


@pytest.fixture(scope="module")
def reference(served: ServedModel) -> Iterator[Llama]:
    """The same file in llama-cpp-python's high-level API, its logits kept for every row,
    loaded as the server loaded it: flash attention as it is there, and the CPU's extra
    weight buffers as the engine decides (`Llama` has no switch for them: the default
    parameters' hook, as benchmarks/decode_overhead.py does)."""
    original = C.llama_model_default_params

    def params() -> Any:
        p = original()
        p.use_extra_bufts = use_extra_buffers(None)
        return p

    C.llama_model_default_params = params
    try:
        llm = Llama(
            model_path=str(served.model.path),
            n_ctx=1024,
            n_threads=2,
            n_batch=512,
            flash_attn=served.model.flash_attn_on,
            logits_all=True,
            verbose=False,
        )
    finally:
        C.llama_model_default_params = original
    yield llm
    llm.close()


@pytest.fixture
def client(server: ServerThread) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, timeout=120) as c:
        yield c


def log_softmax(row: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    x = row.astype(np.float64)
    m = np.max(x)
    return x - (m + np.log(np.sum(np.exp(x - m))))


def check_against_reference(
    llm: Llama, served: ServedModel, prompt: Sequence[int], got: Sequence[dict[str, Any]]
) -> None:
    """Feed `prompt`, then each answered token, through `llm`; each entry of `got` (token,
    logprob, bytes, top_logprobs) must be that step's log-softmax."""
    model = served.model
    assert got, "no tokens were reported"
    llm.reset()
    llm.eval(list(prompt))
    for k, entry in enumerate(got):
        lp = log_softmax(np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32))
        best = int(np.argmax(lp))
        # Greedy: the token handed out is the most likely one, and it leads its list.
        assert bytes(entry["bytes"]) == model.token_bytes(best), (k, entry["token"])
        assert abs(entry["logprob"] - lp[best]) < TOL, (k, entry["logprob"], lp[best])
        top = entry["top_logprobs"]
        assert top and bytes(top[0]["bytes"]) == bytes(entry["bytes"])
        want = np.argsort(-lp, kind="stable")[: len(top)]
        assert [a["logprob"] for a in top] == pytest.approx(lp[want].tolist(), abs=TOL)
        for alt in top:  # each one names a token of that probability
            ids = [
                int(t)
                for t in want
                if model.token_bytes(int(t), special=True) == bytes(alt["bytes"])
            ]
            assert any(abs(alt["logprob"] - lp[t]) < TOL for t in ids), (k, alt)
        llm.eval([best])


def test_chat_whole_and_streamed_match_the_reference(
    client: openai.OpenAI, served: ServedModel, reference: Llama
) -> None:
    def ask(stream: bool) -> Any:
        return client.chat.completions.create(
            model="smollm2",
            messages=ASK,  # type: ignore[arg-type]
            temperature=0,
            max_tokens=16,
            logprobs=True,
            top_logprobs=5,
            stream=stream,
            extra_body=RAW,
        )

    whole = ask(False)
    choice = whole.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content
    content = [e.model_dump() for e in choice.logprobs.content]
    assert b"".join(bytes(e["bytes"]) for e in content).decode() == choice.message.content
    prompt = served.model.chat_tokens(ASK)
    assert whole.usage is not None and whole.usage.prompt_tokens == len(prompt)
    check_against_reference(reference, served, prompt, content)

    streamed = []
    with ask(True) as s:
        for chunk in s:
            for c in chunk.choices:
                if c.delta.content:
                    assert c.logprobs is not None and c.logprobs.content is not None
                    streamed += [e.model_dump() for e in c.logprobs.content]
    assert streamed == content


def test_completions_match_the_reference(
    client: openai.OpenAI, served: ServedModel, reference: Llama
) -> None:
    prompt = "The three primary colours are"

    def ask(stream: bool) -> Any:
        return client.completions.create(
            model="smollm2",
            prompt=prompt,
            temperature=0,
            max_tokens=16,
            logprobs=3,
            stream=stream,
            extra_body=RAW,
        )

    whole = ask(False)
    lp = whole.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs
    assert "".join(lp.tokens) == whole.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    # The columns as chat entries: the reference checks the same numbers.
    entries = [
        {
            "token": t,
            "logprob": v,
            "bytes": list(t.encode()),
            "top_logprobs": [
                {"token": a, "logprob": x, "bytes": list(a.encode())} for a, x in top.items()
            ],
        }
        for t, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True)
    ]
    check_against_reference(reference, served, served.model.tokenize(prompt), entries)

    streamed: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "text_offset": []}
    for chunk in ask(True):
        for c in chunk.choices:
            if c.text:
                assert c.logprobs is not None
                for key, got in streamed.items():
                    got += getattr(c.logprobs, key)
    assert streamed == {k: getattr(lp, k) for k in streamed}


def test_ollama_chat_matches_the_reference(
    server: ServerThread, served: ServedModel, reference: Llama
) -> None:
    with ollama.Client(host=server.url, headers={"Authorization": f"Bearer {API_KEY}"}) as c:
        options = {"temperature": 0, "num_predict": 16, "repeat_penalty": 1.0}
        r = c.chat(model="smollm2", messages=ASK, options=options, logprobs=True, top_logprobs=3)
        assert r.logprobs
        got = [{**e.model_dump(), "bytes": list(e.token.encode())} for e in r.logprobs]
        for e, raw in zip(got, r.logprobs, strict=True):
            e["top_logprobs"] = [
                {"token": a.token, "logprob": a.logprob, "bytes": list(a.token.encode())}
                for a in raw.top_logprobs or ()
            ]
        assert "".join(e["token"] for e in got) == r.message.content
        check_against_reference(reference, served, served.model.chat_tokens(ASK), got)
        streamed = []
        for part in c.chat(
            model="smollm2",
            messages=ASK,
            options=options,
            logprobs=True,
            top_logprobs=3,
            stream=True,
        ):
            streamed += [e.model_dump() for e in part.logprobs or ()]
        assert streamed == [e.model_dump() for e in r.logprobs]
