"""Hub search and file listing against the local Hub emulator (real HTTP, real GGUF bytes)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.services.hub import (
    HubClient,
    HubNotFound,
    HubOffline,
    card_summary,
    group_variants,
    header_fit,
    quantization_of,
    remote_gguf,
)
from engine.memory.estimate import estimate
from engine.memory.hardware import GiB, cpu_only, simulate
from engine.memory.params import EstimateParams
from engine.model.gguf import read_gguf
from tests.hub_emulator import HubEmulator, running_hub, tiny_gguf

README = b"""---
license: mit
tags: [gguf]
---
# SmolLM2 GGUF

![logo](x.png)

SmolLM2 is a family of **compact** language models, see [the paper](https://x).

More text.
"""


@pytest.fixture
def hub(smollm2_path: Path) -> Iterator[HubEmulator]:
    with running_hub() as emu:
        r = emu.repo(
            "bartowski/SmolLM2-135M-Instruct-GGUF",
            downloads=900,
            likes=10,
            last_modified="2026-03-01T00:00:00.000Z",
            license=None,
        )
        r.add("SmolLM2-135M-Instruct-Q4_1.gguf", source=smollm2_path)
        r.add("SmolLM2-135M-Instruct-Q8_0.gguf", data=b"q8" * 5000)
        r.add("SmolLM2-135M-Instruct-f16-00001-of-00002.gguf", data=b"a" * 3000)
        r.add("SmolLM2-135M-Instruct-f16-00002-of-00002.gguf", data=b"b" * 2000)
        r.add("Q2_K/SmolLM2-135M-Instruct-00001-of-00003.gguf", data=b"c" * 100)
        r.add("mmproj-SmolLM2-f16.gguf", data=b"p" * 10)
        r.add("README.md", data=README, lfs=False)
        r.add("config.json", data=b"{}", lfs=False)
        emu.repo(
            "unsloth/gemma-3-270m-it-GGUF",
            downloads=500,
            likes=50,
            last_modified="2026-05-01T00:00:00.000Z",
        ).add("gemma-3-270m-it-Q4_K_M.gguf", data=b"g" * 10)
        emu.repo("someone/smollm2-safetensors", downloads=10_000, tags=["safetensors"])
        yield emu


def test_search_finds_gguf_repos_sorted_as_asked(hub: HubEmulator) -> None:
    client = HubClient(hub.url)
    by_downloads = client.search("", sort="downloads")
    assert [r.repo_id for r in by_downloads] == [
        "bartowski/SmolLM2-135M-Instruct-GGUF",
        "unsloth/gemma-3-270m-it-GGUF",
    ]
    assert (
        next(r.repo_id for r in client.search("", sort="likes")) == "unsloth/gemma-3-270m-it-GGUF"
    )
    assert (
        next(r.repo_id for r in client.search("", sort="updated")) == "unsloth/gemma-3-270m-it-GGUF"
    )
    smol = client.search("smollm2")
    # The safetensors-only repo matches the text but has no GGUF files: filtered out.
    assert [r.repo_id for r in smol] == ["bartowski/SmolLM2-135M-Instruct-GGUF"]
    assert smol[0].downloads == 900 and smol[0].likes == 10
    assert smol[0].last_modified is not None and smol[0].last_modified.startswith("2026-03-01")
    searches = [r for r in hub.requests if r["path"].startswith("/api/models?")]
    assert all("filter=gguf" in r["path"] for r in searches)


def test_files_grouped_by_quantization_with_exact_sizes(
    hub: HubEmulator, smollm2_path: Path
) -> None:
    d = HubClient(hub.url).repo_details("bartowski/SmolLM2-135M-Instruct-GGUF")
    by_name = {v.name: v for v in d.variants}
    q4 = by_name["SmolLM2-135M-Instruct-Q4_1.gguf"]
    assert q4.quantization == "Q4_1"
    assert q4.size == smollm2_path.stat().st_size
    assert q4.first_file.sha256 is not None and len(q4.first_file.sha256) == 64
    assert by_name["SmolLM2-135M-Instruct-Q8_0.gguf"].size == 10_000
    f16 = by_name["SmolLM2-135M-Instruct-f16.gguf"]  # two shards, one model
    assert f16.quantization == "F16" and f16.size == 5000 and len(f16.files) == 2
    assert f16.complete
    q2 = by_name["Q2_K/SmolLM2-135M-Instruct.gguf"]  # quantization named by the folder
    assert q2.quantization == "Q2_K" and not q2.complete  # 1 of 3 shards on the Hub
    assert by_name["mmproj-SmolLM2-f16.gguf"].kind == "projector"
    assert "README.md" not in by_name and "config.json" not in by_name
    assert d.license == "mit"  # from the card's front matter
    assert d.summary == "SmolLM2 is a family of compact language models, see the paper."
    assert d.commit == hub.repos["bartowski/SmolLM2-135M-Instruct-GGUF"].sha
    assert d.variant("SmolLM2-135M-Instruct-f16-00002-of-00002.gguf") is f16


@pytest.mark.parametrize(
    ("name", "quant"),
    [
        ("Llama-3.2-3B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
        ("qwen2.5-7b-instruct-q8_0-00001-of-00002.gguf", "Q8_0"),
        ("gemma-3-27b-it-IQ2_XXS.gguf", "IQ2_XXS"),
        ("Mistral-7B.Q5_K_S.gguf", "Q5_K_S"),
        ("phi-4-BF16.gguf", "BF16"),
        ("model-fp16.gguf", "F16"),
        ("DeepSeek-R1-UD-IQ1_S/part.gguf", "IQ1_S"),
        ("gpt-oss-20b-MXFP4.gguf", "MXFP4"),
        ("Q4_0-model.gguf", "Q4_0"),
        ("model.gguf", "unknown"),
    ],
)
def test_quantization_names(name: str, quant: str) -> None:
    assert quantization_of(name) == quant


def test_grouping_ignores_non_gguf_files() -> None:
    from app.services.hub import HubFile

    vs = group_variants([HubFile("a-Q4_0.gguf", 5, None), HubFile("notes.txt", 1, None)])
    assert [v.name for v in vs] == ["a-Q4_0.gguf"]


def test_card_summary_skips_markup() -> None:
    assert (
        card_summary("---\nlicense: x\n---\n<div>hi</div>\n\n| a | b |\n\nPlain *text*.\n")
        == "Plain text."
    )
    assert card_summary("x" * 1000, limit=20).endswith("…")


def test_unknown_repo_is_a_clear_404(hub: HubEmulator) -> None:
    with pytest.raises(HubNotFound) as exc:
        HubClient(hub.url).repo_details("nobody/nothing")
    assert "no repository called nobody/nothing" in str(exc.value)
    assert "\n" not in str(exc.value)


def test_offline_is_reported_as_offline() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = HubClient(f"http://127.0.0.1:{port}")
    with pytest.raises(HubOffline) as exc:
        client.search("llama")
    assert "offline" in str(exc.value) and "\n" not in str(exc.value)


def test_gated_repo_lists_files_but_explains_access(smollm2_path: Path) -> None:
    with running_hub() as emu:
        r = emu.repo("google/gemma-gated", gated=True, granted_tokens={"hf_granted"})
        r.add("gemma-Q4_1.gguf", source=smollm2_path)
        # Metadata is public on the real Hub, the bytes are not: the fit badge (a Range read of
        # the header) fails with a 401 and says "unknown" rather than breaking the listing.
        d = HubClient(emu.url, fit=header_fit(cpu_only(8 * GiB))).repo_details("google/gemma-gated")
        assert d.gated and d.fits["gemma-Q4_1.gguf"] == "unknown (needs access)"
        with_token = HubClient(
            emu.url, token=lambda: "hf_granted", fit=header_fit(cpu_only(8 * GiB))
        )
        assert with_token.repo_details("google/gemma-gated").fits["gemma-Q4_1.gguf"] == "RAM only"


def test_fit_badge_reads_only_the_header(hub: HubEmulator, smollm2_path: Path) -> None:
    """The badge comes from engine.memory's analytic estimate of the header fetched with Range
    requests: the same numbers as the estimate of the local file, for a fraction of its bytes."""
    hw_cpu = cpu_only(8 * GiB)
    client = HubClient(hub.url, fit=header_fit(hw_cpu))
    d = client.repo_details("bartowski/SmolLM2-135M-Instruct-GGUF")
    name = "SmolLM2-135M-Instruct-Q4_1.gguf"
    assert d.fits[name] == "RAM only"
    local = estimate(read_gguf(smollm2_path), EstimateParams(), hardware=hw_cpu, method="analytic")
    assert local.verdict == "ram_only"
    ranged = [r for r in hub.requests if r.get("file") == name and r["range"]]
    fetched = sum(
        int(r["range"].split("-")[1]) - int(r["range"][6:].split("-")[0]) + 1
        for r in ranged
        if r.get("cdn")
    )
    assert 0 < fetched < smollm2_path.stat().st_size // 10
    # A GPU with room for everything, and one far too small for this model and RAM.
    big = HubClient(hub.url, fit=header_fit(simulate([24 * GiB], hw_cpu)))
    assert big.fit_badge(d.repo_id, d.variant(name), d.commit or "main") == "fits on GPU"  # type: ignore[arg-type]
    tiny = HubClient(hub.url, fit=header_fit(cpu_only(64 * 1024 * 1024)))
    assert tiny.fit_badge(d.repo_id, d.variant(name), d.commit or "main") == "too big"  # type: ignore[arg-type]


def test_hf_hub_offline_is_honoured(hub: HubEmulator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    client = HubClient(hub.url)
    with pytest.raises(HubOffline, match="HF_HUB_OFFLINE"):
        client.search("smol")
    with pytest.raises(HubOffline, match="HF_HUB_OFFLINE"):
        client.repo_details("bartowski/SmolLM2-135M-Instruct-GGUF")
    assert hub.requests == []  # not one request left the machine


def test_split_model_header_merges_every_shard(tmp_path: Path) -> None:
    one = tiny_gguf(tmp_path / "one.gguf", "split", shard=0)
    two = tiny_gguf(tmp_path / "two.gguf", "split", shard=1)
    with running_hub() as emu:
        r = emu.repo("me/split-GGUF")
        r.add("m-F16-00001-of-00002.gguf", source=one)
        r.add("m-F16-00002-of-00002.gguf", source=two)
        client = HubClient(emu.url)
        d = client.repo_details("me/split-GGUF")
        (variant,) = d.variants
        gf = remote_gguf(client, d.repo_id, d.commit or "main", variant)
    local = [read_gguf(one), read_gguf(two)]
    assert [t.name for t in gf.tensors] == [t.name for g in local for t in g.tensors]
    assert gf.file_size == one.stat().st_size + two.stat().st_size
    assert gf.metadata["general.name"] == "split"
