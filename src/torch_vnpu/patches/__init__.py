"""Every change torch_vnpu makes to the behaviour of PyTorch and other libraries, in one registry.

vnpu is a PrivateUse1 device whose kernels are ATen's CPU kernels. Where a library decides by a device-type list
(``"cuda"``, ``"cpu"``, ...) instead of asking the device, torch_vnpu replaces the deciding function for vnpu
only. Each such patch is declared in :mod:`torch_vnpu.patches.registry` with the library and version it was
written and checked against, why it exists, and the upstream change that would make it unnecessary (the list a
chip team would take upstream). Patch sites apply them through :func:`replace` (an attribute) or :func:`record`
(an entry of a table, such as Inductor's lowerings), both of which refuse an unregistered patch id.

``python -m torch_vnpu.patches`` lists them with the installed library versions; ``--markdown`` prints the
docs page "Where PyTorch is not device-neutral".
"""

from __future__ import annotations

import importlib.metadata

from .registry import PATCHES, Patch

__all__ = ["PATCHES", "Patch", "by_id", "replace", "record", "applied", "installed_version", "version_mismatches"]

_BY_ID = {p.id: p for p in PATCHES}
_applied: dict[str, set[str]] = {}  # patch id -> targets applied in this process


def by_id(patch_id: str) -> Patch:
    """The registered patch ``patch_id``. Raises KeyError (naming the registry) for an unknown id."""
    try:
        return _BY_ID[patch_id]
    except KeyError:
        raise KeyError(f"{patch_id!r} is not declared in src/torch_vnpu/patches/registry.py: declare every patch "
                       "there (library, checked version, reason, upstream fix)") from None


def _qualname(owner: object, name: str) -> str:
    module = getattr(owner, "__module__", None) if isinstance(owner, type) else None
    base = getattr(owner, "__qualname__", None) or getattr(owner, "__name__", type(owner).__name__)
    return f"{module}.{base}.{name}" if module else f"{base}.{name}"


def record(patch_id: str, target: str) -> None:
    """Notes that patch ``patch_id`` changed ``target`` (a qualified name) in this process."""
    by_id(patch_id)
    _applied.setdefault(patch_id, set()).add(target)


def replace(owner: object, name: str, value: object, patch_id: str) -> object:
    """``setattr(owner, name, value)`` for the registered patch ``patch_id``; returns the value replaced."""
    by_id(patch_id)
    before = getattr(owner, name, None)
    setattr(owner, name, value)
    record(patch_id, _qualname(owner, name))
    return before


def applied() -> dict[str, list[str]]:
    """{patch id: sorted targets} of the patches applied in this process so far (lazy ones apply when their
    library or Inductor is first used)."""
    return {k: sorted(v) for k, v in sorted(_applied.items())}


def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution (``"torch"`` -> ``"2.13.0"``, local tag dropped), or None."""
    try:
        return importlib.metadata.version(distribution).split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        return None


def version_mismatches() -> list[tuple[Patch, str]]:
    """(patch, installed version) for every patch whose library is installed at another version than the one
    the patch was checked against: re-check those patches (and update ``checked``) before relying on them."""
    out = []
    for p in PATCHES:
        have = installed_version(p.library)
        if have is not None and have != p.checked:
            out.append((p, have))
    return out
