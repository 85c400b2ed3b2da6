"""`candlewick serve`'s LoRA options, as llama-server's: --lora FILE and --lora-scaled FILE SCALE
in one list (the adapters' ids are the order given), --lora-init-without-apply loads them at 0."""

from __future__ import annotations

import pytest

from app.cli import build_parser, serve_cmd


def params(*args: str) -> tuple[tuple[str, float], ...]:
    return serve_cmd.serve_load_params(build_parser().parse_args(["serve", *args])).loras


def test_adapters_keep_the_order_given() -> None:
    assert params() == ()
    given = ("--lora", "a.gguf", "--lora-scaled", "b.gguf", "0.25", "--lora", "c.gguf")
    assert params(*given) == (("a.gguf", 1.0), ("b.gguf", 0.25), ("c.gguf", 1.0))
    assert params(*given, "--lora-init-without-apply") == (
        ("a.gguf", 0.0),
        ("b.gguf", 0.0),
        ("c.gguf", 0.0),
    )
    assert params("--lora", "a.gguf") == (("a.gguf", 1.0),)  # a second parse starts empty


@pytest.mark.parametrize(
    ("scale", "error"),
    [("high", "the scale 'high' is not a number"), ("nan", "the scale must be a finite number")],
)
def test_a_bad_scale_is_refused(scale: str, error: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        params("--lora-scaled", "b.gguf", scale)
    assert e.value.code == 2
    assert f"--lora-scaled: {error}" in capsys.readouterr().err
