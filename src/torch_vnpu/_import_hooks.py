"""Run a function right after a module has been imported (or at once if it already was), without importing it.

torch_vnpu adapts parts of PyTorch that ``import torch`` does not load (Dynamo, Inductor, DTensor, ...) when
they are first imported, so that importing torch stays as fast as without vnpu. A meta path finder wraps the
loader of each watched module name (one shot each); the module keeps its real loader afterwards.
"""

from __future__ import annotations

import importlib.abc
import sys
import warnings
from types import ModuleType
from typing import Callable


class _HookedLoader(importlib.abc.Loader):
    """Runs ``hook(module)`` after the wrapped loader executed ``module``."""

    def __init__(self, loader, hook: Callable[[ModuleType], None]):
        self._loader = loader
        self._hook = hook

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        # The module keeps its real loader (source lookups, reloads).
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        run_hook(self._hook, module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """A meta path finder that only wraps the loaders of the watched module names (one shot each)."""

    def __init__(self) -> None:
        self.hooks: dict[str, Callable[[ModuleType], None]] = {}

    def find_spec(self, fullname, path, target=None):
        hook = self.hooks.get(fullname)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            del self.hooks[fullname]
            spec.loader = _HookedLoader(spec.loader, hook)
        return spec


_finder = _PostImportFinder()


def run_hook(hook: Callable[[ModuleType], None], module: ModuleType) -> None:
    """Calls ``hook(module)``; an exception becomes a RuntimeWarning (the user's import goes on)."""
    try:
        hook(module)
    except Exception as e:  # never break the user's import
        warnings.warn(f"torch_vnpu: adapting {module.__name__} to vnpu failed: {e!r}", RuntimeWarning)


def when_imported(name: str, hook: Callable[[ModuleType], None]) -> None:
    """Calls ``hook(module)`` once module ``name`` is imported (now, if it already is)."""
    module = sys.modules.get(name)
    if module is not None:
        run_hook(hook, module)
        return
    earlier = _finder.hooks.get(name)
    if earlier is not None:  # several hooks on one module run in the order they were added
        first, then = earlier, hook

        def hook(module: ModuleType) -> None:
            run_hook(first, module)
            run_hook(then, module)

    _finder.hooks[name] = hook
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
