"""The fast tier's guard in child processes.

`make test-fast` (CANDLEWICK_FAST_TIER=1) puts this folder first on PYTHONPATH, so every
Python a test starts (`candlewick run`, a server, a probe) imports this module at startup.
It makes `Model.__init__` raise there as tests/conftest.py makes it raise in the tier's own
process: a test that loads a model in a child fails in a line saying so instead of quietly
slowing the tier down. `engine.host.runtime` is patched when something imports it, so a
child that loads no model pays nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

NO_MODEL = "the fast tier loads no model: mark this test `model` (it loads one in a child)"
TARGET = "engine.host.runtime"


class _Refusing(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)

        def refuse(self: object, *args: object, **kwargs: object) -> None:
            raise RuntimeError(NO_MODEL)

        module.Model.__init__ = refuse


class _Guard(importlib.abc.MetaPathFinder):
    def find_spec(
        self, name: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != TARGET:
            return None
        sys.meta_path.remove(self)  # find the real module the ordinary way
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Refusing(spec.loader)
        return spec


sys.meta_path.insert(0, _Guard())
