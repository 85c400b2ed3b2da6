"""Starting again with glibc's huge-page tunable: when it is done, and that it takes effect."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from engine.native import huge_pages
from engine.native.huge_pages import thp_mode, tunables_with_huge_pages

GLIBC = ("glibc", "2.36")


def decide(environ: dict[str, str] | None = None, **kw: object) -> str | None:
    args: dict[str, object] = {"system": "linux", "libc": GLIBC, "thp": "madvise", **kw}
    return tunables_with_huge_pages(environ or {}, **args)  # type: ignore[arg-type]


def test_the_kernels_selected_mode_is_read_from_its_setting() -> None:
    assert thp_mode("always [madvise] never\n") == "madvise"
    assert thp_mode("[always] madvise never") == "always"
    assert thp_mode("always madvise [never]") == "never"
    assert thp_mode("") is None


def test_linux_glibc_in_madvise_mode_starts_again_with_the_tunable() -> None:
    assert decide() == "glibc.malloc.hugetlb=1"


def test_other_tunables_are_kept_and_a_chosen_hugetlb_is_left_alone() -> None:
    assert (
        decide({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
        == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    )
    # Already started with it (no loop), or the user's own value (0, or 2 for hugetlbfs).
    assert decide({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}) is None
    assert decide({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) is None


@pytest.mark.parametrize(
    ("kw", "env"),
    [
        ({"thp": "always"}, {}),  # every buffer has huge pages already
        ({"thp": "never"}, {}),  # disabled by the administrator
        ({"thp": None}, {}),  # a kernel without THP
        ({"system": "darwin"}, {}),
        ({"system": "win32"}, {}),
        ({"libc": ("glibc", "2.34")}, {}),  # before the tunable existed
        ({"libc": ("", "")}, {}),  # musl and other C libraries
        ({}, {"CANDLEWICK_HUGE_PAGES": "0"}),
        ({}, {"CANDLEWICK_HUGE_PAGES": "off"}),
    ],
)
def test_nothing_is_done_where_it_cannot_help(kw: dict[str, object], env: dict[str, str]) -> None:
    assert decide(env, **kw) is None


# Allocates 64 MiB the way llama.cpp's buffers are (malloc, then written) and reports what the
# kernel gave it. `restart_with_huge_pages` runs first, as in the command line's entry point.
CHILD = """
import json, os, sys
from engine.native.huge_pages import restart_with_huge_pages, in_use, read_thp_mode
restart_with_huge_pages()
buf = bytearray(b"\\x01") * (64 << 20)
huge = 0
with open("/proc/self/smaps_rollup") as f:
    for line in f:
        if line.startswith("AnonHugePages:"):
            huge = int(line.split()[1]) * 1024
print(json.dumps({"pid": os.getpid(), "argv": sys.argv[1:], "in_use": in_use(),
                  "thp": read_thp_mode(), "huge": huge}))
"""
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="glibc's tunable, Linux's /proc")


@pytest.fixture
def child(tmp_path: Path) -> Path:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return script


def child_env(**extra: str) -> dict[str, str]:
    """This environment as a fresh start has it (no tunable, no opt-out), plus `extra`."""
    drop = (huge_pages.TUNABLES_VAR, huge_pages.OPT_OUT_VAR)
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), **extra}


def last_json(stdout: str) -> dict[str, object]:
    seen: dict[str, object] = json.loads(stdout.strip().splitlines()[-1])
    return seen


@linux_only
def test_the_restarted_process_is_the_same_one_and_its_buffers_get_huge_pages(
    child: Path,
) -> None:
    env = child_env()
    proc = subprocess.Popen(
        [sys.executable, str(child), "an argument"], stdout=subprocess.PIPE, text=True, env=env
    )
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0
    seen = last_json(out)
    assert seen["pid"] == proc.pid  # execve: the same process, not a child
    assert seen["argv"] == ["an argument"]
    thp = seen["thp"]
    assert thp is None or isinstance(thp, str)
    expected = huge_pages.tunables_with_huge_pages(
        env, system=sys.platform, libc=platform.libc_ver(), thp=thp
    )
    assert seen["in_use"] is (expected is not None)
    huge = seen["huge"]
    assert isinstance(huge, int)
    if expected is not None:
        assert huge >= 32 << 20  # most of the 64 MiB in 2 MiB pages
    elif thp != "always":
        assert huge == 0


@linux_only
def test_the_opt_out_keeps_the_process_as_it_started(child: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(child)],
        capture_output=True,
        text=True,
        env=child_env(CANDLEWICK_HUGE_PAGES="0"),
        timeout=120,
    )
    assert out.returncode == 0
    assert last_json(out.stdout)["in_use"] is False
