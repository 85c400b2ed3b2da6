"""The engine core's shape, checked from its source (ARCHITECTURE.md, "Rooms"): small modules
and classes, no import circle, and one module that calls llama.cpp's decode.

Read with `ast` rather than by importing, so `if TYPE_CHECKING:` imports count as edges too:
a circle closed only for the type checker still ties the modules' designs together.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parent.parent / "engine"
MAX_MODULE_LINES = 700
MAX_CLASS_LINES = 450
# The calls that make llama.cpp run the model or hold its batches: only the backend makes them.
DECODE_CALLS = {"llama_decode", "llama_encode", "llama_batch_init", "llama_batch_free",
                "llama_batch_get_one"}  # fmt: skip


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(ENGINE.rglob("*.py")):
        parts = list(path.relative_to(ENGINE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


@functools.cache  # three checks walk every module: parsed once (the walks only read)
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _imports(name: str, path: Path) -> Iterator[str]:
    """Every engine module `name` imports, a package's own `__init__` included."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            # `import engine.host.scheduler` runs engine, engine.host and the module itself.
            parts = target.split(".")
            for i in range(2, len(parts) + 1):
                candidate = ".".join(parts[:i])
                if candidate in MODULES and candidate != name:
                    yield candidate


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        circles.append(sorted(component))
    return circles


def test_no_import_circle_in_the_engine_counting_type_checking_imports() -> None:
    graph = {name: set(_imports(name, path)) for name, path in MODULES.items()}
    # A package's __init__ importing its own submodules is how packages re-export; the circle
    # that matters is a submodule importing its package (or a sibling) back.
    for name in graph:
        graph[name] = {t for t in graph[name] if not (t.startswith(name + "."))}
    assert _circles(graph) == []


def test_the_circle_finder_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_engine_module_and_its_classes_are_small(name: str) -> None:
    path = MODULES[name]
    lines = path.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_MODULE_LINES, f"{name}: {lines} lines"
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
            size = node.end_lineno - node.lineno + 1
            assert size <= MAX_CLASS_LINES, f"{name}.{node.name}: {size} lines"


def _decode_callers() -> set[str]:
    callers = set()
    for name, path in MODULES.items():
        for node in ast.walk(_tree(path)):
            used = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
            if isinstance(node, ast.alias):
                used = node.name
            if used in DECODE_CALLS:
                callers.add(name)
    return callers


def test_one_module_calls_llama_cpps_decode() -> None:
    assert _decode_callers() == {"engine.native.backend"}
