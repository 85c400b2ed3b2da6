"""The OpenAI routes driven by the official `openai` client (sync and async, streaming or not)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import openai
import pytest

from engine.server import ServerThread
from tests.engine.server.conftest import API_KEY, N_SLOTS, assert_no_leak, http

MSG = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def client(server: ServerThread) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0) as c:
        yield c


def test_models(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["smollm2"]
    assert client.models.retrieve("smollm2").id == "smollm2"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_chat_non_streaming_and_streaming_agree(client: openai.OpenAI, served: object) -> None:
    # Once first, so both requests below find the prompt cached: on a CPU whose kernels are
    # not batch-exact (Model.exactness; AVX2-only EPYCs), a cold prompt and a cached one are
    # evaluated in other batch splits, and greedy text may differ between them.
    client.chat.completions.create(model="smollm2", messages=MSG, max_tokens=1, temperature=0)  # type: ignore[arg-type]
    r = client.chat.completions.create(
        model="smollm2",
        messages=MSG,  # type: ignore[arg-type]
        max_tokens=24,
        temperature=0,
    )
    text = r.choices[0].message.content
    assert text
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage is not None and r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens

    chunks = list(
        client.chat.completions.create(
            model="smollm2",
            messages=MSG,
            max_tokens=24,
            temperature=0,  # type: ignore[arg-type]
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    finals = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finals == [r.choices[0].finish_reason]
    usage = [c.usage for c in chunks if c.usage]
    assert len(usage) == 1 and usage[0].completion_tokens == r.usage.completion_tokens
    # The second identical prompt reused the slot's cache.
    assert usage[0].prompt_tokens_details is not None
    assert usage[0].prompt_tokens_details.cached_tokens == r.usage.prompt_tokens - 1
    assert_no_leak(served)  # type: ignore[arg-type]


def test_max_tokens_stop_and_seed(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="smollm2",
        messages=MSG,  # type: ignore[arg-type]
        max_tokens=3,
        temperature=0,
    )
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 3
    # A max_tokens above the server's cap is clamped, not refused.
    big = client.completions.create(
        model="smollm2", prompt="Once upon a time", max_tokens=100_000, temperature=0
    )
    assert big.usage is not None and big.usage.completion_tokens <= 64

    full = (
        client.completions.create(
            model="smollm2", prompt="1, 2, 3, 4,", max_tokens=12, temperature=0
        )
        .choices[0]
        .text
    )
    assert "6" in full
    cut = client.completions.create(
        model="smollm2", prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=["6"]
    )
    assert cut.choices[0].text == full[: full.index("6")]
    assert cut.choices[0].finish_reason == "stop"

    def sample(seed: int) -> str | None:
        return (
            client.chat.completions.create(
                model="smollm2",
                messages=MSG,
                max_tokens=16,  # type: ignore[arg-type]
                temperature=1.0,
                seed=seed,
            )
            .choices[0]
            .message.content
        )

    assert sample(7) == sample(7)


def test_completions_streaming(client: openai.OpenAI) -> None:
    full = client.completions.create(
        model="smollm2", prompt="The sky is", max_tokens=10, temperature=0
    )
    pieces = list(
        client.completions.create(
            model="smollm2", prompt="The sky is", max_tokens=10, temperature=0, stream=True
        )
    )
    assert "".join(p.choices[0].text for p in pieces) == full.choices[0].text
    assert pieces[-1].choices[0].finish_reason == full.choices[0].finish_reason


def test_async_client_concurrent_streams(server: ServerThread, served: object) -> None:
    async def main() -> tuple[list[str], str]:
        async with openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key=API_KEY, max_retries=0
        ) as ac:

            async def one(q: str) -> str:
                stream = await ac.chat.completions.create(
                    model="smollm2",
                    messages=[{"role": "user", "content": q}],
                    max_tokens=16,
                    temperature=0,
                    stream=True,
                )
                return "".join(
                    [c.choices[0].delta.content or "" async for c in stream if c.choices]
                )

            qs = ["Name a fruit.", "Name a color.", "Name an animal."]
            texts = await asyncio.gather(*(one(q) for q in qs))
            single = await ac.chat.completions.create(
                model="smollm2",
                messages=[{"role": "user", "content": qs[0]}],
                max_tokens=16,
                temperature=0,
            )
            return list(texts), single.choices[0].message.content or ""

    texts, single = asyncio.run(main())
    assert all(texts)
    assert texts[0] == single  # concurrent streaming == one request alone
    assert_no_leak(served)  # type: ignore[arg-type]


def test_embeddings(client: openai.OpenAI) -> None:
    r = client.embeddings.create(
        model="smollm2",
        input=[
            "The cat sat on the mat.",
            "A cat is sitting on a rug.",
            "Quarterly taxes are due in April.",
        ],
    )
    a, b, c = (d.embedding for d in r.data)
    assert len(a) == len(b) > 100

    def dot(x: list[float], y: list[float]) -> float:
        return sum(i * j for i, j in zip(x, y, strict=True))

    assert abs(dot(a, a) - 1.0) < 1e-3
    assert dot(a, b) > dot(a, c)  # similar sentences are closer
    floats = http.post(
        client.base_url.join("embeddings").__str__(),
        headers={"Authorization": f"Bearer {API_KEY}"},
        json={"input": "The cat sat on the mat.", "encoding_format": "float"},
    ).json()
    assert floats["data"][0]["embedding"] == pytest.approx(a, abs=1e-6)


def test_errors_are_openai_shaped(
    client: openai.OpenAI, base_url: str, auth: dict[str, str]
) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="smollm2",
            messages=MSG,  # type: ignore[arg-type]
            n=2,
        )
    assert "n=1" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="smollm2", messages=[], max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(
            model="smollm2",
            messages=MSG,  # type: ignore[arg-type]
            temperature=-1,
        )
    url = base_url + "/v1/chat/completions"
    cases = [
        (b"{not json", 400),
        (b"[1, 2]", 400),
        (b"", 400),
        (b'{"messages": [{"role": "user", "content": 5}]}', 400),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', 400),
        (b'{"messages": [{"role": "user", "content": "x"}], "stop": [1]}', 400),
        (b'{"messages": [{"role": "wizard", "content": "x"}]}', 400),
        (b'{"messages": [{"role": "user", "content": "' + b"x" * 70_000 + b'"}]}', 413),
    ]
    for body, status in cases:
        r = http.post(url, content=body, headers={**auth, "Content-Type": "application/json"})
        assert r.status_code == status, body[:60]
        err = r.json()["error"]
        assert err["message"] and err["type"]
    too_long = "word " * 3000  # more tokens than a slot's context
    r = http.post(url, headers=auth, json={"messages": [{"role": "user", "content": too_long}]})
    assert r.status_code == 400 and "context" in r.json()["error"]["message"]
    r = http.get(base_url + "/v1/nothing", headers=auth)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = http.put(url, headers=auth)
    assert r.status_code == 405 and "POST" in r.headers["allow"]


def test_a_repeated_prompt_comes_back_from_the_ram_cache_after_a_burst(
    server: ServerThread, served: object
) -> None:
    """An API client's prompt whose slot a burst of other requests took is read again only
    from its last token: its KV state was saved in RAM before the slot was reused (what
    llama-server's prompt cache does). That the restored cells give the reply they gave is
    tested on the fake backend (test_scheduler_policy.py): here a batch and a single token may
    take different CPU kernels, so greedy text may differ after a restore on some machines."""
    repeated = [{"role": "user", "content": "[7] Write a long story about a lighthouse keeper."}]

    async def main() -> tuple[list[int], list[str]]:
        async with openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key=API_KEY, max_retries=0
        ) as ac:

            async def one(messages: list[dict[str, str]]) -> tuple[int, int, str]:
                r = await ac.chat.completions.create(
                    model="smollm2",
                    messages=messages,
                    max_tokens=8,
                    temperature=0,  # type: ignore[arg-type]
                )
                assert r.usage is not None and r.usage.prompt_tokens_details is not None
                cached = r.usage.prompt_tokens_details.cached_tokens or 0
                return r.usage.prompt_tokens, cached, r.choices[0].message.content or ""

            cached, texts = [], []
            for round_no in range(2):
                n, c, text = await one(repeated)
                cached.append(c)
                texts.append(text)
                burst = [
                    [{"role": "user", "content": f"[{100 + 10 * round_no + i}] Name a city."}]
                    for i in range(N_SLOTS)
                ]
                await asyncio.gather(*(one(m) for m in burst))  # every slot taken
            return [n, *cached], texts

    (n, first, again), texts = asyncio.run(main())
    assert again == n - 1 > first
    assert all(texts)
    assert_no_leak(served)  # type: ignore[arg-type]
