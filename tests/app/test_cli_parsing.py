"""The argument trees of `candlewick`'s sub-commands, parsed in this process: every command's
--help, bad arguments refused by argparse (exit 2, one error line) and what options put in
the namespace the handlers read. Nothing here runs a handler, so no model is loaded; what
the handlers do with their arguments is tested in the other CLI test files."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pytest

from app.cli import bench_cmd, build_parser, estimate_cmd, main, run_cmd, serve_cmd
from engine.host.host import DEFAULT_KEEP_S
from engine.settings import LoadParams, SamplingParams


def command_paths(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> list[tuple[str, ...]]:
    """Every command of the tree, found by walking it (so a new one is tested too)."""
    out = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += command_paths(sub, (*prefix, name))
    return out


COMMANDS = command_paths(build_parser())


def parse(*args: str) -> argparse.Namespace:
    return build_parser().parse_args(list(args))


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """argparse's refusal of `args`: exit 2 and a usage, then one error line, returned."""
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    assert exc.value.code == 2, args
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err, args
    lines = err.strip().splitlines()
    assert lines[0].startswith("usage: candlewick"), args
    errors = [line for line in lines if ": error: " in line]
    assert errors == [lines[-1]], args  # the error is the last line, and the only one
    return lines[-1]


def test_the_tree_has_every_command() -> None:
    assert {" ".join(p) for p in COMMANDS} >= {
        "",
        "run",
        "serve",
        "estimate",
        "bench",
        "bench compare",
        "chats list",
        "chats export",
        "chats import",
        "models list",
        "models search",
        "models files",
        "models download",
        "models delete",
        "models import",
        "models token",
        "connections list",
        "connections add",
        "connections remove",
        "connections test",
        "connections models",
    }


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "candlewick")
def test_help_exits_0(path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*path, "--help"])
    assert exc.value.code == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.startswith(f"usage: {' '.join(('candlewick', *path))}")
    assert "show this help message and exit" in out


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["launch"], "candlewick: error: argument COMMAND: invalid choice: 'launch'"),
        (["--nope"], "candlewick: error: unrecognized arguments: --nope"),
        (["run"], "candlewick run: error: the following arguments are required: model, prompt"),
        (
            ["run", "default", "hi", "--max-tokens", "0"],
            "candlewick run: error: argument --max-tokens: must be at least 1",
        ),
        (
            ["run", "default", "hi", "--ctx", "4k"],
            "candlewick run: error: argument --ctx: '4k' is not a whole number",
        ),
        (
            ["run", "default", "hi", "--kv-type", "q2"],
            "candlewick run: error: argument --kv-type: invalid choice: 'q2'",
        ),
        (
            ["run", "default", "hi", "--temperature", "warm"],
            "candlewick run: error: argument --temperature: invalid float value: 'warm'",
        ),
        (
            ["run", "default", "hi", "--lookup", "--draft", "small.gguf"],
            "candlewick run: error: argument --draft: not allowed with argument --lookup",
        ),
        (
            ["serve", "--port", "http"],
            "candlewick serve: error: argument --port: invalid int value",
        ),
        (
            ["serve", "--gpu-layers", "-1"],
            "candlewick serve: error: argument --gpu-layers: must be 0 or more",
        ),
        (["serve", "--keep-alive", "soon"], "candlewick serve: error: argument --keep-alive: "),
        (
            ["serve", "--api-key", "k" * 12, "--api-key-file", "key.txt"],
            "candlewick serve: error: argument --api-key-file: not allowed with argument --api-key",
        ),
        (
            ["serve", "--flash-attn", "maybe"],
            "candlewick serve: error: argument --flash-attn: invalid choice: 'maybe'",
        ),
        (["estimate"], "candlewick estimate: error: the following arguments are required: MODEL"),
        (
            ["estimate", "default", "--method", "guess"],
            "candlewick estimate: error: argument --method: invalid choice: 'guess'",
        ),
        (
            ["bench", "--timeout", "0"],
            "candlewick bench: error: argument --timeout: must be greater than 0",
        ),
        (["bench", "--api", "grpc"], "candlewick bench: error: argument --api: invalid choice"),
        (
            ["bench", "compare", "a.json"],
            "candlewick bench compare: error: the following arguments are required: b",
        ),
        (["chats"], "candlewick chats: error: the following arguments are required: SUBCOMMAND"),
        (
            ["chats", "export", "seven"],
            "candlewick chats export: error: argument id: invalid int value: 'seven'",
        ),
        (
            ["chats", "export", "--format", "pdf"],
            "candlewick chats export: error: argument --format: invalid choice: 'pdf'",
        ),
        (["models"], "candlewick models: error: the following arguments are required: SUBCOMMAND"),
        (
            ["models", "search", "qwen", "--sort", "stars"],
            "candlewick models search: error: argument --sort: invalid choice: 'stars'",
        ),
        (
            ["models", "download", "owner/name"],
            "candlewick models download: error: the following arguments are required: file",
        ),
        (
            ["connections"],
            "candlewick connections: error: the following arguments are required: ACTION",
        ),
        (
            ["connections", "add", "box"],
            "candlewick connections add: error: the following arguments are required: url",
        ),
        (
            ["connections", "add", "box", "http://box", "--api-key", "k", "--api-key-stdin"],
            "candlewick connections add: error: argument --api-key-stdin: not allowed with "
            "argument --api-key",
        ),
        (
            ["connections", "add", "box", "http://box", "--timeout", "long"],
            "candlewick connections add: error: argument --timeout: invalid float value: 'long'",
        ),
    ],
)
def test_bad_arguments_exit_2_with_one_error_line(
    args: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert refused(capsys, *args).startswith(error)


def test_run_options_land_in_the_namespace() -> None:
    a = parse(
        "run",
        "default",
        "Hi there",
        "--max-tokens",
        "64",
        "--temperature",
        "0",
        "--top-k",
        "20",
        "--seed",
        "7",
        "--stop",
        "\n\n",
        "--stop",
        "END",
        "--ctx",
        "2048",
        "--gpu-layers",
        "all",
        "--threads",
        "3",
        "--system",
        "Be brief.",
        "--kv-type",
        "q8_0",
        "--flash-attn",
        "on",
        "--lookup",
        "--draft-max",
        "8",
        "--json",
        "--force",
    )
    assert (a.command, a.model, a.prompt) == ("run", "default", "Hi there")
    assert (a.max_tokens, a.temperature, a.top_k, a.seed) == (64, 0.0, 20, 7)
    assert a.stop == ["\n\n", "END"]
    assert (a.ctx, a.gpu_layers, a.threads, a.system) == (2048, "all", 3, "Be brief.")
    assert (a.kv_type, a.flash_attn, a.lookup, a.draft, a.draft_max) == (
        "q8_0",
        "on",
        True,
        None,
        8,
    )
    assert a.json and a.force and a.connection is None
    assert a.handler is run_cmd.run


def test_run_defaults_are_the_apps_sampling_defaults() -> None:
    a = parse("run", "model.gguf", "Hi")
    d = SamplingParams()
    assert (a.temperature, a.top_p, a.top_k, a.min_p, a.repeat_penalty) == (
        d.temperature,
        d.top_p,
        d.top_k,
        d.min_p,
        d.repeat_penalty,
    )
    assert (a.max_tokens, a.ctx, a.gpu_layers, a.seed, a.stop) == (512, 4096, "auto", None, [])
    assert (a.kv_type, a.flash_attn, a.lookup, a.json) == ("f16", "auto", False, False)
    assert parse("run", "m", "Hi", "--gpu-layers", "12").gpu_layers == 12


def test_serve_options_and_defaults(tmp_path: Path) -> None:
    d = parse("serve")
    assert (d.model, d.host, d.port, d.parallel, d.ctx) == ("default", "127.0.0.1", 8080, 4, 4096)
    assert (d.api_key, d.api_key_file, d.cors_origin) == (None, None, [])
    assert (d.max_queue, d.max_tokens, d.timeout, d.keep_alive) == (64, 4096, 600.0, DEFAULT_KEEP_S)
    assert not d.no_embeddings and d.ram_budget is None and d.handler is serve_cmd.run
    key_file = tmp_path / "key.txt"
    a = parse(
        "serve",
        "--model",
        "qwen",
        "--host",
        "0.0.0.0",
        "--port",
        "0",
        "--api-key-file",
        str(key_file),
        "--parallel",
        "8",
        "--cors-origin",
        "http://a.example",
        "--cors-origin",
        "http://b.example",
        "--keep-alive",
        "1h30m",
        "--ram-budget",
        "12.5",
        "--no-embeddings",
        "--lookup",
    )
    assert (a.model, a.host, a.port, a.parallel) == ("qwen", "0.0.0.0", 0, 8)
    assert a.api_key_file == key_file and a.api_key is None
    assert a.cors_origin == ["http://a.example", "http://b.example"]
    assert (a.keep_alive, a.ram_budget, a.no_embeddings, a.lookup) == (5400.0, 12.5, True, True)
    # A negative keep-alive keeps the model loaded (None), 0 unloads it when idle.
    assert parse("serve", "--keep-alive", "-1").keep_alive is None
    assert parse("serve", "--keep-alive", "0").keep_alive == 0.0


def test_bench_and_compare_namespaces() -> None:
    a = parse(
        "bench",
        "--url",
        "http://127.0.0.1:8080",
        "--api",
        "ollama",
        "--concurrency",
        "1,4,16",
        "--requests",
        "3",
        "--slo-ttft",
        "0.5",
        "--json",
        "-q",
    )
    assert (a.url, a.model, a.api) == ("http://127.0.0.1:8080", None, "ollama")
    assert (a.concurrency, a.requests, a.slo_ttft, a.json, a.quiet) == (
        [1, 4, 16],
        3,
        0.5,
        True,
        True,
    )
    assert a.bench_command is None
    d = parse("bench")
    assert (d.concurrency, d.requests, d.workload, d.timeout) == ([1, 2, 4], 8, "chat", 300.0)
    c = parse("bench", "compare", "a.json", "b.json", "--json")
    assert (c.bench_command, c.a, c.b, c.compare_json) == (
        "compare",
        Path("a.json"),
        Path("b.json"),
        True,
    )
    assert c.handler is not a.handler


def test_estimate_models_chats_and_connections_namespaces() -> None:
    e = parse(
        "estimate",
        "hf:owner/repo/file.gguf",
        "--ctx",
        "8192",
        "--parallel",
        "2",
        "--simulate-gpu",
        "8GiB",
        "--simulate-gpu",
        "24GiB",
        "--method",
        "analytic",
    )
    assert (e.model, e.ctx, e.parallel, e.method) == (
        "hf:owner/repo/file.gguf",
        8192,
        2,
        "analytic",
    )
    assert e.simulate_gpu == [8 << 30, 24 << 30]
    s = parse("models", "search", "qwen coder", "--sort", "likes", "--limit", "5")
    assert (s.models_command, s.query, s.sort, s.limit, s.json) == (
        "search",
        "qwen coder",
        "likes",
        5,
        False,
    )
    rm = parse("models", "delete", "smollm2", "-y")
    assert (rm.id, rm.yes) == ("smollm2", True)
    ex = parse("chats", "export", "12", "--format", "md", "-o", "out.md")
    assert (ex.chats_command, ex.id, ex.format, ex.output) == ("export", 12, "md", Path("out.md"))
    assert parse("chats", "export").id is None  # all of them
    add = parse(
        "connections",
        "add",
        "box",
        "http://box:8000/v1",
        "--api",
        "ollama",
        "--api-key-env",
        "BOX_KEY",
        "--timeout",
        "30",
        "--replace",
    )
    assert (add.connections_command, add.name, add.url, add.api) == (
        "add",
        "box",
        "http://box:8000/v1",
        "ollama",
    )
    assert (add.api_key, add.api_key_env, add.timeout, add.replace) == (None, "BOX_KEY", 30.0, True)


LOAD_COMMANDS = ("run", "serve", "estimate", "bench")
LOAD_ARGS = (
    *("--ctx", "2048", "--gpu-layers", "3", "--threads", "2", "--kv-type", "q8_0"),
    *("--flash-attn", "on", "--batch", "256", "--ubatch", "128", "--cache-ram", "64"),
    *("--mmproj", "mmproj-f16.gguf"),
)


def load_options(command: str) -> dict[str, argparse.Action]:
    """The actions of a command's "load options" group, by option string."""
    sub = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices[command]
    group = next(g for g in sub._action_groups if g.title == "load options")
    return {a.option_strings[0]: a for a in group._group_actions}


def test_the_four_commands_declare_the_same_load_options() -> None:
    """One declaration: the same options with the same types, choices and defaults; only what
    --ctx means (per slot, per request, shared) is said per command, and bench sizes its own."""
    first = load_options("run")
    assert set(first) == {
        "--ctx",
        "--gpu-layers",
        "--threads",
        "--kv-type",
        "--flash-attn",
        "--batch",
        "--ubatch",
        "--cache-ram",
        "--mmproj",
    }
    for command in LOAD_COMMANDS[1:]:
        actions = load_options(command)
        assert set(actions) == set(first), command
        for opt, a in actions.items():
            b = first[opt]
            assert (a.dest, a.type, a.choices) == (b.dest, b.type, b.choices), (command, opt)
            if opt != "--ctx":
                assert (a.default, a.help) == (b.default, b.help), (command, opt)
    assert load_options("bench")["--ctx"].default is None


def test_the_four_commands_make_the_same_load_params() -> None:
    """The same load arguments give the same LoadParams in each command (one sequence each;
    speculative decoding is each command's own)."""
    made = {
        "run": run_cmd.run_load_params(parse("run", "m", "Hi", *LOAD_ARGS)),
        "serve": serve_cmd.serve_load_params(parse("serve", "--parallel", "1", *LOAD_ARGS)),
        "estimate": estimate_cmd.estimate_load_params(parse("estimate", "m", *LOAD_ARGS)),
        "bench": bench_cmd.bench_load_params(
            parse("bench", "--concurrency", "1", *LOAD_ARGS), 2048
        ),
    }
    expected = LoadParams(
        n_ctx=2048,
        n_gpu_layers=3,
        n_threads=2,
        type_k="q8_0",
        type_v="q8_0",
        flash_attn="on",
        n_batch=256,
        n_ubatch=128,
        state_cache_mb=64,
        mmproj="mmproj-f16.gguf",
    )
    for command, params in made.items():
        assert replace(params, speculative=None) == expected, command
    # Without them, every command loads with the engine's defaults.
    assert replace(run_cmd.run_load_params(parse("run", "m", "Hi")), speculative=None) == (
        LoadParams()
    )
    assert estimate_cmd.estimate_load_params(parse("estimate", "m")) == LoadParams()


def test_cache_ram_sets_the_prompt_cache_budget() -> None:
    """--cache-ram (llama-server's name) is the RAM prompt cache's budget in MiB; 0 turns it
    off, a negative or fractional size is refused before anything loads."""
    serve = serve_cmd.serve_load_params(parse("serve", "--cache-ram", "0"))
    assert serve.state_cache_mb == 0
    run = run_cmd.run_load_params(parse("run", "m", "Hi", "--cache-ram", "1024"))
    assert run.state_cache_mb == 1024
    for bad in ("-1", "1.5", "lots"):
        with pytest.raises(SystemExit) as e:
            parse("serve", "--cache-ram", bad)
        assert e.value.code == 2


def test_slots_share_out_the_context_as_each_command_documents() -> None:
    # serve: --ctx per slot; bench: per concurrent request; estimate: --parallel shares --ctx.
    serve = serve_cmd.serve_load_params(parse("serve", "--parallel", "4", "--ctx", "1024"))
    assert (serve.n_ctx, serve.n_seq_max) == (4096, 4)
    bench = bench_cmd.bench_load_params(parse("bench", "--concurrency", "1,2,4"), 1024)
    assert (bench.n_ctx, bench.n_seq_max) == (4096, 4)
    est = estimate_cmd.estimate_load_params(
        parse("estimate", "m", "--parallel", "4", "--ctx", "1024")
    )
    assert (est.n_ctx, est.n_seq_max) == (1024, 4)
    # Drafting turns 'auto' flash attention on in run (exact speculation needs it).
    lookup = run_cmd.run_load_params(parse("run", "m", "Hi", "--lookup"))
    assert lookup.flash_attn == "on" and lookup.drafting


def test_top_level_flags() -> None:
    a = parse("-v", "serve")
    assert a.verbose and not a.self_test and a.command == "serve"
    b = parse()
    assert b.command is None  # no command: main starts the desktop app
