"""torch_vnpu.patches: every change torch_vnpu makes to PyTorch and other libraries is declared in one registry,
with the library version it was checked against; the registry matches what is applied; the docs page is
generated from it."""

import ast
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from torch_vnpu import patches

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "torch_vnpu"
# Libraries whose behaviour torch_vnpu changes; assigning to one of their attributes is a patch.
FOREIGN = {"torch", "transformers", "accelerate", "peft", "safetensors", "lightning", "pytorch_lightning",
           "lightning_fabric"}


def test_every_patched_library_is_installed_at_the_version_its_patches_were_checked_against():
    """A library upgrade must re-check its patches: update `checked` in src/torch_vnpu/patches/registry.py after
    re-checking each listed patch against the new version's source."""
    stale = [f"{p.id}: checked against {p.library} {p.checked}, installed {have}"
             for p, have in patches.version_mismatches()]
    assert not stale, "\n".join(stale)


def test_registry_entries_are_complete_and_unique():
    ids = [p.id for p in patches.PATCHES]
    assert len(ids) == len(set(ids))
    for p in patches.PATCHES:
        assert p.targets and p.reason and p.upstream and p.checked and p.when, p.id
        assert patches.by_id(p.id) is p
    with pytest.raises(KeyError, match="registry.py"):
        patches.replace(object(), "x", 1, "no-such-patch")


CHILD = r"""
import json, os, sys
import torch
import torch_vnpu.patches as patches
stages = {"import": sorted(patches.applied())}
import torch.nn.attention.flex_attention  # noqa: F401
import torch.distributed.tensor  # noqa: F401
import torch._inductor.cudagraph_trees  # noqa: F401
import torch.distributed.checkpoint  # noqa: F401
f = torch.compile(lambda x: (x * 2).sum(), backend="inductor")
f(torch.ones(4, device="vnpu"))
stages["compile"] = sorted(patches.applied())
import accelerate, peft, safetensors.torch, transformers, lightning  # noqa: F401,E401
import transformers.training_args, transformers.generation.utils, peft.utils.other  # noqa: F401,E401
stages["integrations"] = sorted(patches.applied())
import torch_vnpu.port.cuda  # noqa: F401
stages["port"] = sorted(patches.applied())
print(json.dumps(stages))
"""


def test_what_is_applied_is_what_the_registry_declares(tmp_path):
    """In a fresh process: after import, after the first compile, after the libraries are imported and after
    port mode is switched on, each stage's patches (by `when`) are applied, and nothing unregistered (replace()
    and record() refuse unknown ids, so an applied id is a registered one)."""
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=600,
                          cwd=str(tmp_path), env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    stages = json.loads(proc.stdout.strip().splitlines()[-1])
    by_when = {}
    for p in patches.PATCHES:
        by_when.setdefault(p.when, set()).add(p.id)
    assert by_when["import"] <= set(stages["import"]), by_when["import"] - set(stages["import"])
    import_of = set().union(*(ids for when, ids in by_when.items() if when.startswith("import of ")))
    expected = by_when["import"] | import_of | by_when["first compile"]
    assert expected <= set(stages["compile"]), expected - set(stages["compile"])
    expected |= by_when["integration"]
    assert expected <= set(stages["integrations"]), expected - set(stages["integrations"])
    expected |= by_when["port mode"]
    assert expected == set(stages["port"]), expected ^ set(stages["port"])


def _foreign_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in FOREIGN:
                    names.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] in FOREIGN:
            names.update(a.asname or a.name for a in node.names)
    return names


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def test_every_change_to_another_library_goes_through_the_registry():
    """No module assigns to an attribute of PyTorch or a third-party library (or calls setattr on one) except
    through patches.replace(); a function that writes into one of their tables also calls patches.record().
    A write that uses a library's API as intended (a cache it asks backends to fill) says so on its line:
    `# not a patch: <why>`."""
    offences = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "patches" and path.name == "__init__.py":
            continue
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source, str(path))
        foreign = _foreign_names(tree)

        def exempt(node) -> bool:  # "# not a patch: <why>" on the line or the line above
            return any("# not a patch:" in lines[i] for i in (node.lineno - 1, node.lineno - 2) if i >= 0)

        for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.Module))]:
            body = fn.body if isinstance(fn, ast.Module) else [fn]
            calls_record = any(isinstance(c, ast.Call) and getattr(c.func, "id", None) == "record"
                               for b in body for c in ast.walk(b))
            for stmt in (n for b in body for n in ast.walk(b)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else \
                    [stmt.target] if isinstance(stmt, (ast.AugAssign, ast.AnnAssign)) else []
                for t in targets:
                    if exempt(t):
                        continue
                    if isinstance(t, ast.Attribute) and _root(t) in foreign:
                        offences.append(f"{path.relative_to(PACKAGE)}:{t.lineno}: assigns {ast.unparse(t)}")
                    elif isinstance(t, ast.Subscript) and _root(t) in foreign and not calls_record:
                        offences.append(f"{path.relative_to(PACKAGE)}:{t.lineno}: writes {ast.unparse(t)} "
                                        "without patches.record()")
                if isinstance(stmt, ast.Call) and getattr(stmt.func, "id", None) == "setattr" and stmt.args \
                        and _root(stmt.args[0]) in foreign:
                    offences.append(f"{path.relative_to(PACKAGE)}:{stmt.lineno}: {ast.unparse(stmt)}")
    assert not sorted(set(offences)), "\n".join(sorted(set(offences)))


def test_the_docs_page_is_generated_from_the_registry():
    """docs/device_neutrality.md is `python -m torch_vnpu.patches --markdown`: regenerate it after changing the
    registry (`make patches-page`)."""
    from torch_vnpu.patches.__main__ import markdown

    page = (ROOT / "docs" / "device_neutrality.md").read_text()
    assert page == markdown() + "\n", "docs/device_neutrality.md is stale: run `make patches-page`"


def test_the_command_lists_every_patch():
    proc = subprocess.run([sys.executable, "-m", "torch_vnpu.patches"], capture_output=True, text=True,
                          timeout=120, cwd=str(ROOT / "tests"))
    assert proc.returncode == 0, proc.stderr
    for p in patches.PATCHES:
        assert p.id in proc.stdout
    assert textwrap.dedent(proc.stdout).splitlines()[0].split()[:5] == ["patch", "library", "checked",
                                                                         "installed", "when"]
