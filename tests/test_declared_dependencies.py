"""Every distribution the code imports is declared in pyproject.toml.

engine/ and app/ may import only what `[project].dependencies` declares; the tests, benchmarks
and installer scripts also what the `dev` extra adds. A module that is only installed because
another dependency pulls it in works until that dependency drops it or a new version renames
it, so it is declared in its own right.

Not counted: the standard library, the repository's own modules, and imports guarded by a
`try` that handles their `ImportError` (optional: the code runs without them).
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUNTIME_CODE = ("engine", "app")
DEV_CODE = ("tests", "benchmarks", "installers")
# Handlers that catch an ImportError (bare `except:` too).
IMPORT_ERROR_HANDLERS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(requirements: Iterable[str]) -> set[str]:
    names = set()
    for req in requirements:
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
        assert m, f"unreadable requirement {req!r}"
        names.add(canonical(m.group(1)))
    return names


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    kinds = handler.type
    if kinds is None:
        return True
    names = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]
    return any(isinstance(n, ast.Name) and n.id in IMPORT_ERROR_HANDLERS for n in names)


class _Imports(ast.NodeVisitor):
    """The top-level modules a file imports unconditionally, with their line numbers."""

    def __init__(self) -> None:
        self.found: dict[str, list[int]] = {}
        self._optional = 0

    def visit_Try(self, node: ast.Try | ast.TryStar) -> None:
        optional = any(_catches_import_error(h) for h in node.handlers)
        self._optional += optional
        for stmt in node.body:
            self.visit(stmt)
        self._optional -= optional
        for part in (*node.handlers, *node.orelse, *node.finalbody):
            self.visit(part)

    visit_TryStar = visit_Try

    def generic_visit(self, node: ast.AST) -> None:
        # An import is a statement: only the lists that hold statements are walked (bodies,
        # handlers, match cases), never the expressions, most of a file's nodes.
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            children = getattr(node, field, None)
            if isinstance(children, list):
                for child in children:
                    self.visit(child)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module:  # relative imports are the package's own
            self._add(node.module, node.lineno)

    def _add(self, module: str, line: int) -> None:
        if not self._optional:
            self.found.setdefault(module.partition(".")[0], []).append(line)


def imports_under(folders: Iterable[str]) -> dict[str, list[str]]:
    """Top-level module -> where it is imported ("path:line"), for every .py file there."""
    where: dict[str, list[str]] = {}
    for folder in folders:
        for path in sorted((REPO / folder).rglob("*.py")):
            visitor = _Imports()
            visitor.visit(ast.parse(path.read_bytes(), filename=str(path)))
            rel = path.relative_to(REPO).as_posix()
            for module, lines in visitor.found.items():
                where.setdefault(module, []).extend(f"{rel}:{n}" for n in lines)
    return where


def own_modules() -> set[str]:
    """The repository's own top-level names: its root packages and modules, and the modules
    of its script folders (no __init__.py: a script runs with its folder on sys.path, and the
    tests put such folders there too)."""
    names = set()
    for p in REPO.iterdir():
        if p.name.startswith("."):
            continue
        if p.is_dir():
            names.add(p.name)
            if not (p / "__init__.py").exists():
                names.update(q.stem for q in p.glob("*.py"))
        elif p.suffix == ".py":
            names.add(p.stem)
    return names


def undeclared(folders: Iterable[str], declared: set[str]) -> list[str]:
    """One line per imported distribution that `declared` lacks, or module none provides."""
    providers = importlib.metadata.packages_distributions()
    skip = own_modules() | set(sys.stdlib_module_names)
    problems = []
    for module, where in sorted(imports_under(folders).items()):
        if module in skip:
            continue
        dists = sorted({canonical(d) for d in providers.get(module, [])})
        places = ", ".join(where[:3]) + (f" and {len(where) - 3} more" if len(where) > 3 else "")
        if not dists:
            problems.append(
                f"module {module} (no installed distribution provides it), imported in {places}"
            )
        elif not declared.intersection(dists):
            problems.append(f"{' or '.join(dists)} (module {module}), imported in {places}")
    return problems


def project_table() -> dict[str, object]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text("utf-8"))["project"]
    assert isinstance(project, dict)
    return project


def runtime_requirements() -> set[str]:
    deps = project_table()["dependencies"]
    assert isinstance(deps, list)
    return requirement_names(deps)


def dev_requirements() -> set[str]:
    extras = project_table()["optional-dependencies"]
    assert isinstance(extras, dict)
    return requirement_names(extras["dev"])


def test_the_engine_and_app_import_only_declared_dependencies() -> None:
    missing = undeclared(RUNTIME_CODE, runtime_requirements())
    assert not missing, "not in [project].dependencies:\n" + "\n".join(missing)


def test_tests_and_tools_import_only_declared_or_dev_dependencies() -> None:
    missing = undeclared(DEV_CODE, runtime_requirements() | dev_requirements())
    assert not missing, "not in [project].dependencies or the dev extra:\n" + "\n".join(missing)


def test_a_guarded_import_is_optional_and_an_unguarded_one_counts() -> None:
    visitor = _Imports()
    visitor.visit(
        ast.parse(
            "import json\n"
            "try:\n    import pynvml\nexcept ImportError:\n    pynvml = None\n"
            "try:\n    import yaml\nexcept KeyError:\n    pass\n"
            "try:\n    pass\nexcept Exception:\n    import fallback_mod\n"
            "from . import sibling\n"
            "from huggingface_hub.errors import HfHubHTTPError\n"
        )
    )
    assert set(visitor.found) == {"json", "yaml", "fallback_mod", "huggingface_hub"}


def test_requirement_names_are_compared_canonically() -> None:
    assert requirement_names(
        [
            "PySide6-Essentials>=6.8,!=6.12.0",
            "llama_cpp.python[server]",
            "jinja2 ; python_version >= '3.11'",
        ]
    ) == {"pyside6-essentials", "llama-cpp-python", "jinja2"}
