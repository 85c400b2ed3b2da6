"""`candlewick models settings`: shows each value with its source, saves and forgets values
for one model, refuses a bad one with one line, and reads past a broken file."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from app.services.model_settings import ModelSettingsStore
from tests.app.cli_inproc import run_cli


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("models", "settings", *args)


def shown(r: subprocess.CompletedProcess[str]) -> dict[str, dict[str, object]]:
    assert r.returncode == 0, r.stderr
    settings: dict[str, dict[str, object]] = json.loads(r.stdout)["settings"]
    return settings


def test_show_set_unset_clear(smollm2_path: Path) -> None:
    s = shown(cli("default", "--set", "n_ctx=8192", "--set", "temperature=0.3", "--json"))
    assert s["n_ctx"] == {"value": 8192, "source": "saved for this model"}
    assert s["temperature"] == {"value": 0.3, "source": "saved for this model"}
    assert s["type_k"] == {"value": "f16", "source": "default"}
    assert ModelSettingsStore.for_paths().get(smollm2_path).saved == {
        "n_ctx": 8192,
        "temperature": 0.3,
    }
    table = cli("default")
    assert table.returncode == 0
    line = next(x for x in table.stdout.splitlines() if x.split()[:1] == ["n_ctx"])
    assert line.split() == ["n_ctx", "8192", "saved", "for", "this", "model"]
    s = shown(cli("default", "--unset", "n_ctx", "--json"))
    assert s["n_ctx"]["source"] == "default" and s["temperature"]["value"] == 0.3
    s = shown(cli("default", "--clear", "--json"))
    assert {v["source"] for v in s.values()} == {"default"}


def test_bad_values_and_files_are_one_line() -> None:
    for args in (["--set", "n_ctx=4"], ["--set", "colour=red"], ["--set", "n_ctx"]):
        r = cli("default", *args)
        assert r.returncode == 2
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert r.stderr.startswith("candlewick: error: ")
    path = ModelSettingsStore.for_paths().path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json", "utf-8")
    r = cli("default", "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "using the defaults" in r.stderr


def test_run_takes_the_saved_settings_under_its_typed_options(smollm2_path: Path) -> None:
    from app.cli import build_parser, run_cmd

    ModelSettingsStore.for_paths().save(
        smollm2_path,
        {"n_ctx": 1024, "type_k": "q8_0", "type_v": "q8_0", "temperature": 0.1, "top_k": 5},
    )

    def settings(*typed: str) -> tuple[object, ...]:
        args = build_parser("run").parse_args(["run", "default", "Hi", *typed])
        p, s = run_cmd.with_saved_settings(
            smollm2_path, args, run_cmd.run_load_params(args), run_cmd._sampling(args)
        )
        return p.n_ctx, p.type_k, s.temperature, s.top_k, s.top_p

    # Saved over the defaults; the defaults where nothing is saved.
    assert settings() == (1024, "q8_0", 0.1, 5, 0.95)
    # Typed options win.
    assert settings("--ctx", "2048", "--kv-type", "f16", "--temperature", "0.7") == (
        2048,
        "f16",
        0.7,
        5,
        0.95,
    )


def test_run_sizes_its_context_to_the_answer_unless_told(smollm2_path: Path) -> None:
    from app.cli import build_parser, run_cmd
    from engine.model.gguf import read_gguf

    def n_ctx(*typed: str, prompt: str = "Hi") -> int:
        args = build_parser("run").parse_args(["run", "default", prompt, *typed])
        p, _ = run_cmd.with_saved_settings(
            smollm2_path, args, run_cmd.run_load_params(args), run_cmd._sampling(args)
        )
        return p.n_ctx

    train = int(read_gguf(smollm2_path).arch_value("context_length"))
    # A short prompt: its bytes + 512 answer tokens + the template's 128, in steps of 256.
    assert n_ctx() == 768
    assert n_ctx("--max-tokens", "64") == 512  # never below 512
    assert n_ctx("--max-tokens", "380") == 512
    assert n_ctx("--lookup", "--max-tokens", "380") == 768  # drafts past the answer's end
    assert n_ctx("--max-tokens", "100", prompt="x" * 3000) == 3328  # bytes bound the tokens
    assert n_ctx(prompt="x" * (2 * train)) == train  # never above the training context
    assert n_ctx("--image", "photo.png") == 4096  # media tokens are not counted: --ctx's default
    # --ctx given, or a context saved for the model, wins.
    assert n_ctx("--ctx", "4096") == 4096
    ModelSettingsStore.for_paths().save(smollm2_path, {"n_ctx": 2048})
    assert n_ctx() == 2048
    assert n_ctx("--ctx", "1024") == 1024


def test_one_shot_ctx_rounds_and_clamps() -> None:
    from app.cli.run_cmd import one_shot_ctx

    assert one_shot_ctx(0, 1, 8192) == 512
    assert one_shot_ctx(1000, 512, 8192) == 1792  # 1,640 cells rounded up to 256
    assert one_shot_ctx(1000, 512, 1024) == 1024
    assert one_shot_ctx(1000, 512, 0) == 1792  # unknown training context: no cap
