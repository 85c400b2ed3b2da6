"""Transparent huge pages for the model's buffers, by starting the process with glibc's
`glibc.malloc.hugetlb=1` tunable.

llama.cpp keeps what a decode step streams through in memory it allocates with malloc: the
weights repacked for AMX or CPU_REPACK kernels, the KV cache and the compute buffers. Most
Linux distributions ship transparent huge pages in "madvise" mode, so those buffers get 4 KiB
pages: a 100 MiB model is 25,000 pages whose translations miss the TLB on every token, and the
hardware prefetchers stop at each page's end. With the tunable, glibc marks the memory it maps
with MADV_HUGEPAGE and the kernel backs it with 2 MiB pages from the first touch.

Measured on a 2-core Xeon with AMX (SmolLM2-135M Q4_1, docs/benchmarks.md "Huge pages"):
llama-bench's decode 1.06x faster, and 215 MiB of the engine's memory in huge pages.

glibc reads tunables once, when a process starts, and offers no call to change this one later,
so the command line's entry point starts itself again (execve: the same process id, the same
arguments and open files) with the tunable added. Collapsing the buffers after the load
instead (madvise MADV_COLLAPSE) copies them, and on a fragmented machine leaves part behind.

Nothing is done where it cannot help: not Linux with glibc 2.35 or newer (the tunable's
first release), huge pages "never" (disabled) or "always" (every buffer has them already), a
GLIBC_TUNABLES that already says what to do with `glibc.malloc.hugetlb`, or
CANDLEWICK_HUGE_PAGES=0 in the environment (the user's way out).
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

TUNABLE = "glibc.malloc.hugetlb"
TUNABLES_VAR = "GLIBC_TUNABLES"
OPT_OUT_VAR = "CANDLEWICK_HUGE_PAGES"
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
FIRST_GLIBC = (2, 35)


def thp_mode(text: str) -> str | None:
    """The selected mode of the kernel's THP setting ("always [madvise] never" -> "madvise")."""
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return None


def glibc_version(libc: tuple[str, str]) -> tuple[int, int] | None:
    """(major, minor) of `platform.libc_ver()`'s answer when it is glibc, else None."""
    name, version = libc
    if name != "glibc":
        return None
    try:
        major, minor = version.split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def tunables_with_huge_pages(
    environ: Mapping[str, str],
    *,
    system: str,
    libc: tuple[str, str],
    thp: str | None,
) -> str | None:
    """The GLIBC_TUNABLES value to start again with, or None to go on as the process is."""
    if environ.get(OPT_OUT_VAR, "").strip().lower() in ("0", "no", "off", "false"):
        return None
    if system != "linux":
        return None
    version = glibc_version(libc)
    if version is None or version < FIRST_GLIBC:
        return None
    if thp != "madvise":
        return None
    current = environ.get(TUNABLES_VAR, "")
    items = [item for item in current.split(":") if item]
    if any(item.split("=", 1)[0] == TUNABLE for item in items):
        return None  # already started with it, or the user chose a value
    return ":".join([*items, f"{TUNABLE}=1"])


def read_thp_mode() -> str | None:
    try:
        return thp_mode(THP_ENABLED.read_text())
    except OSError:
        return None


def restart_argv() -> tuple[str, list[str]]:
    """The program and arguments that start this process again as it was started."""
    if getattr(sys, "frozen", False):  # a bundle: its executable takes the same arguments
        return sys.executable, [sys.executable, *sys.argv[1:]]
    # The interpreter's own options (-X, -W...) and the script or -m module are in orig_argv.
    return sys.executable, [sys.executable, *sys.orig_argv[1:]]


def restart_with_huge_pages() -> None:
    """Start this process again with the tunable when it would help; returns only when it
    would not (or when starting again failed, which is logged and otherwise harmless)."""
    env = dict(os.environ)
    value = tunables_with_huge_pages(
        env, system=sys.platform, libc=platform.libc_ver(), thp=read_thp_mode()
    )
    if value is None:
        return
    env[TUNABLES_VAR] = value
    program, argv = restart_argv()
    flush_standard_streams()
    try:
        os.execve(program, argv, env)
    except OSError as e:
        log.debug("could not start again with huge pages: %s", e)


def flush_standard_streams() -> None:
    """What was printed but not yet written would be lost with the process image."""
    for stream in (sys.stdout, sys.stderr):
        # closed, or None in a windowed bundle
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()


def in_use() -> bool:
    """Whether this process runs with the tunable on (`run --json` says so)."""
    items = os.environ.get(TUNABLES_VAR, "").split(":")
    return f"{TUNABLE}=1" in items


__all__ = [
    "in_use",
    "restart_with_huge_pages",
    "thp_mode",
    "tunables_with_huge_pages",
]
