"""Switch the library adapters on when the library they patch is first imported.

``torch_vnpu``'s registration (run by ``import torch`` through the ``torch.backends`` entry point) calls
:func:`install`, which puts a meta-path finder at the front of ``sys.meta_path``. The finder only looks at the
few module names in ``_TRIGGERS``; for those it lets the other finders find the module and marks the spec, so
that when the import machinery finishes executing the module (it sets ``spec._initializing = False``) the
adapter patches it. Nothing else is imported here (no adapter, no library): ``import torch`` stays as fast.

A library imported *before* torch (``import accelerate`` imports torch from its ``__init__``, which loads
torch_vnpu) is marked in ``sys.modules`` the same way and patched when its import finishes.

``VNPU_INTEGRATIONS``: unset, ``1`` or ``all``: every adapter; ``0`` (or ``none``/``off``): none; a
comma-separated list names the adapters to use (``huggingface``) or, with ``-``, the ones to leave off
(``-lightning``). The explicit ``enable()`` of an adapter works whatever this says.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

logger = logging.getLogger("torch_vnpu.integrations")

# Adapter name -> module implementing ``_on_import(trigger_module_name)``.
ADAPTERS = {
    "huggingface": "torch_vnpu.integrations.huggingface",
    "lightning": "torch_vnpu.integrations.lightning",
}

# Module whose import completion switches an adapter on -> adapter name.
_TRIGGERS = {
    "accelerate": "huggingface",
    "transformers.training_args": "huggingface",
    "transformers.generation.utils": "huggingface",
    "transformers.modeling_utils": "huggingface",
    "peft": "huggingface",
    # safetensors.torch, not safetensors: `import safetensors.torch` first imports torch (so torch_vnpu) while
    # it executes; the adapter needs the finished module.
    "safetensors.torch": "huggingface",
    "lightning.fabric": "lightning",
    "lightning_fabric": "lightning",
    "lightning.pytorch": "lightning",
    "pytorch_lightning": "lightning",
}

_OFF = ("0", "none", "off", "false", "no")
_ON = ("", "1", "all", "on", "true", "yes")

_fired: set[str] = set()
_watched_classes: dict[type, type] = {}
_finder: _Finder | None = None


def enabled_adapters(value: str | None = None) -> set[str]:
    """The adapter names ``VNPU_INTEGRATIONS`` (or ``value``) switches on; see the module docstring.

    Unknown names in the list are ignored with a ``UserWarning`` naming the known ones."""
    value = os.environ.get("VNPU_INTEGRATIONS", "") if value is None else value
    value = value.strip().lower()
    if value in _ON:
        return set(ADAPTERS)
    if value in _OFF:
        return set()
    items = [v.strip() for v in value.split(",") if v.strip()]
    wanted = {v for v in items if not v.startswith("-")}
    chosen = set(wanted) if wanted else set(ADAPTERS)
    chosen -= {v[1:] for v in items if v.startswith("-")}
    unknown = {v.lstrip("-") for v in items} - set(ADAPTERS)
    if unknown:
        warnings.warn(
            f"VNPU_INTEGRATIONS={value!r}: unknown adapter(s) {sorted(unknown)}; known: {sorted(ADAPTERS)} "
            "(use e.g. VNPU_INTEGRATIONS=0, VNPU_INTEGRATIONS=-lightning or VNPU_INTEGRATIONS=huggingface)",
            stacklevel=2,
        )
    return chosen & set(ADAPTERS)


def _fire(name: str) -> None:
    """``name`` finished importing: let its adapter patch it (errors become one warning, never a failed import)."""
    if name in _fired or sys.modules.get(name) is None:
        return  # done already, or the import failed (a later import attempt is watched again)
    _fired.add(name)
    adapter = _TRIGGERS[name]
    try:
        import importlib

        importlib.import_module(ADAPTERS[adapter])._on_import(name)
    except Exception as e:  # an adapter must never break the user's import
        warnings.warn(
            f"torch_vnpu: the {adapter} adapter could not patch {name} ({type(e).__name__}: {e}); {name} is left "
            f"as it is (it will not pick vnpu by itself). VNPU_INTEGRATIONS=-{adapter} silences this.",
            RuntimeWarning,
            stacklevel=2,
        )


def _watch(spec: object, name: str) -> None:
    """Call :func:`_fire` when the import machinery marks ``spec`` as initialized (end of ``_load_unlocked``)."""
    base = type(spec)
    if base in _watched_classes.values():
        return
    cls = _watched_classes.get(base)
    if cls is None:

        def __setattr__(self, attr, value, _base=base):
            _base.__setattr__(self, attr, value)
            if attr == "_initializing" and value is False:
                _base.__setattr__(self, "__class__", _base)
                _fire(self.name)

        cls = type(f"_Watched{base.__name__}", (base,), {"__setattr__": __setattr__, "__slots__": ()})
        _watched_classes[base] = cls
    try:
        spec.__class__ = cls
    except TypeError:  # a spec type with another layout: patch now if already imported
        logger.debug("cannot watch the import of %s (spec type %s)", name, base.__name__)


class _Finder:
    """Meta-path finder for the trigger modules only: finds nothing itself, marks the spec others find."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if name not in self.names or name in _fired:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                _watch(spec, name)
                return spec
        return None

    def invalidate_caches(self) -> None:
        pass


def install() -> None:
    """Install the finder for the adapters ``VNPU_INTEGRATIONS`` enables (idempotent; cheap: no import)."""
    global _finder
    adapters = enabled_adapters()
    names = {m for m, a in _TRIGGERS.items() if a in adapters}
    if _finder is not None or not names:
        return
    _finder = _Finder(names)
    sys.meta_path.insert(0, _finder)
    for name in names:  # already imported, or being imported (the library imported torch)
        module = sys.modules.get(name)
        spec = getattr(module, "__spec__", None)
        if spec is None:
            continue
        if getattr(spec, "_initializing", False):
            _watch(spec, name)
        else:
            _fire(name)


def uninstall() -> None:
    """Remove the finder (adapters already applied stay; use their ``disable()``)."""
    global _finder
    if _finder is not None and _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    _finder = None
