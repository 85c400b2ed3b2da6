"""The shipped workloads and user JSONL files."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.bench.workloads import BUILTIN, WorkloadError, load_workload


def test_builtin_workloads_are_well_formed() -> None:
    for name in BUILTIN:
        w = load_workload(name)
        assert w.name == name and len(w.prompts) >= 8
        assert len({p.id for p in w.prompts}) == len(w.prompts)
        assert all(p.messages[-1]["role"] == "user" for p in w.prompts)
        # Realistic answers, not 16-token toys.
        assert sum(p.max_tokens for p in w.prompts) / len(w.prompts) >= 150


def test_rag_prompts_are_2k_to_4k_tokens(smollm2: object) -> None:
    from engine.host.runtime import Model

    assert isinstance(smollm2, Model)
    sizes = [len(smollm2.chat_tokens(list(p.messages))) for p in load_workload("rag").prompts]
    assert all(2000 <= n <= 4000 for n in sizes), sizes
    chat = [len(smollm2.chat_tokens(list(p.messages))) for p in load_workload("chat").prompts]
    assert max(chat) < 200  # short chat turns


def test_take_cycles_in_order() -> None:
    w = load_workload("code")
    ids = [p.id for p in w.take(len(w.prompts) + 2)]
    assert ids[: len(w.prompts)] == [p.id for p in w.prompts]
    assert ids[-2:] == [w.prompts[0].id, w.prompts[1].id]


def test_user_jsonl(tmp_path: Path) -> None:
    f = tmp_path / "mine.jsonl"
    f.write_text(
        '{"prompt": "Hi there", "max_tokens": 12}\n\n'
        '{"id": "x", "messages": [{"role": "system", "content": "Be brief."}, '
        '{"role": "user", "content": "Why?"}]}\n',
        encoding="utf-8",
    )
    w = load_workload(str(f))
    assert w.name == "mine"
    assert w.prompts[0].messages == ({"role": "user", "content": "Hi there"},)
    assert w.prompts[0].max_tokens == 12
    assert w.prompts[1].id == "x" and w.prompts[1].max_tokens == 256


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "has no prompts"),
        ("not json\n", "line 1: not valid JSON"),
        ('{"prompt": "ok"}\n[1, 2]\n', "line 2: expected a JSON object"),
        ('{"messages": []}\n', "non-empty list"),
        ('{"messages": [{"role": "wizard", "content": "x"}]}\n', "needs a role"),
        ('{"prompt": "x", "max_tokens": 0}\n', "max_tokens"),
        ('{"prompt": "x", "max_tokens": true}\n', "max_tokens"),
        ('{"text": "x"}\n', "needs 'messages' or a non-empty 'prompt'"),
    ],
)
def test_bad_jsonl_is_one_clear_line(tmp_path: Path, content: str, message: str) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text(content, encoding="utf-8")
    with pytest.raises(WorkloadError, match=message) as e:
        load_workload(str(f))
    assert "\n" not in str(e.value)


def test_missing_and_binary_files(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="choose chat, rag, code"):
        load_workload(str(tmp_path / "nope.jsonl"))
    f = tmp_path / "bin.jsonl"
    f.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(WorkloadError, match="not UTF-8"):
        load_workload(str(f))
