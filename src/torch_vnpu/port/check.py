"""``python -m torch_vnpu.port.check file.py [dir ...]``: list the hard-coded CUDA calls of Python sources, with
``file:line:column`` and the device-agnostic replacement (``torch.accelerator``, ``torch.amp``,
``torch.get_device_module``), for users who prefer fixing their code to running it under port mode.

Static (``ast``; nothing is imported or run). Reports: ``"cuda"``/``"cuda:i"`` string constants (device
arguments, ``torch.device("cuda")``, comparisons such as ``'cuda' in device``), strings computed from a constant
part that starts with ``"cuda"`` (``f"cuda:{rank}"``, ``"cuda:" + str(i)``, ``"cuda:%d" % i``,
``"cuda:{}".format(i)``; ``torch.device(f"cuda:{rank}")`` as one finding), ``.cuda()`` calls,
``torch.cuda.*`` uses (including ``torch.cuda.amp.autocast`` / ``GradScaler``), ``.is_cuda``,
``torch.backends.cudnn`` / ``torch.backends.cuda`` settings (harmless elsewhere: noted, not needed), and
Lightning's ``accelerator="gpu"`` / ``"cuda"``. Names are resolved through the module's imports (``import torch.cuda
as tc``, ``from torch import cuda``, ``from torch.cuda.amp import GradScaler``): the import and each use are
reported. Exit status 0: nothing found; 1: findings; 2: a file could not be read or parsed (its error on stderr;
no "nothing to change" summary).
"""

from __future__ import annotations

import ast
import os
import sys
from typing import Iterator, NamedTuple

ACC = "torch.accelerator.current_accelerator()"

# torch.cuda.<name> -> device-agnostic replacement.
_CUDA_REPLACEMENTS = {
    "is_available": "torch.accelerator.is_available()",
    "device_count": "torch.accelerator.device_count()",
    "current_device": "torch.accelerator.current_device_index()",
    "set_device": "torch.accelerator.set_device_index(i)",
    "synchronize": "torch.accelerator.synchronize()",
    "current_stream": "torch.accelerator.current_stream()",
    "set_stream": "torch.accelerator.set_stream(s)",
    "Stream": "torch.Stream(device)",
    "Event": "torch.Event(device)",
    "stream": "torch.get_device_module(device).stream(s)",
    "device": "torch.accelerator.device_index(i) (a context manager)",
    "empty_cache": "torch.accelerator.empty_cache()",
    "memory_stats": "torch.accelerator.memory_stats()",
    "memory_allocated": "torch.accelerator.memory_allocated()",
    "max_memory_allocated": "torch.accelerator.max_memory_allocated()",
    "memory_reserved": "torch.accelerator.memory_reserved()",
    "max_memory_reserved": "torch.accelerator.max_memory_reserved()",
    "reset_peak_memory_stats": "torch.accelerator.reset_peak_memory_stats()",
    "reset_accumulated_memory_stats": "torch.accelerator.reset_accumulated_memory_stats()",
    "mem_get_info": "torch.accelerator.get_memory_info()",
    "manual_seed": "torch.manual_seed(seed) (seeds the CPU and every device)",
    "manual_seed_all": "torch.manual_seed(seed) (seeds the CPU and every device)",
    "is_bf16_supported": "torch.get_device_module(device).is_bf16_supported()",
    "amp.autocast": "torch.autocast(device.type, dtype=...)",
    "amp.GradScaler": "torch.amp.GradScaler(device.type)",
    "amp.custom_fwd": "torch.amp.custom_fwd(device_type=device.type)",
    "amp.custom_bwd": "torch.amp.custom_bwd(device_type=device.type)",
    "CUDAGraph": "torch.accelerator.Graph() (on vnpu also torch.vnpu.VNPUGraph)",
    "graph": "torch.get_device_module(device).graph(g) (torch.vnpu.graph on vnpu)",
    "make_graphed_callables": "torch.get_device_module(device).make_graphed_callables(...)",
    "nvtx": "torch.profiler.record_function(name) (a profiler range on any device)",
    "set_sync_debug_mode": "torch.get_device_module(device).set_sync_debug_mode(mode) (torch.vnpu has it)",
    "get_sync_debug_mode": "torch.get_device_module(device).get_sync_debug_mode()",
    "set_per_process_memory_fraction": "torch.get_device_module(device).set_per_process_memory_fraction(f)",
    "memory.CUDAPluggableAllocator": "torch.vnpu.memory.VNPUPluggableAllocator(so, alloc, free) on vnpu (the "
                                     "allocator library is device-specific)",
}

# What ``from <module> import *`` binds that the check knows about.
_STAR_NAMES = {
    "torch.cuda.amp": ("autocast", "GradScaler", "custom_fwd", "custom_bwd"),
    "torch.cuda": tuple(k for k in _CUDA_REPLACEMENTS if "." not in k) + ("amp",),
}


class Finding(NamedTuple):
    path: str
    line: int
    col: int
    code: str
    replacement: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col + 1}: {self.code}  ->  {self.replacement}"


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _is_cuda_string(node: ast.AST) -> bool:
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return False
    v = node.value
    return v == "cuda" or (v.startswith("cuda:") and v[5:].isdigit())


def _cuda_prefix(value: object) -> bool:
    return isinstance(value, str) and (value == "cuda" or value.startswith("cuda:"))


def _is_computed_cuda_string(node: ast.AST) -> bool:
    """A string computed from a constant part that starts with "cuda": ``f"cuda:{rank}"``, ``"cuda:" + str(i)``,
    ``"cuda:%d" % i``, ``"cuda:{}".format(i)``."""
    if isinstance(node, ast.JoinedStr):
        return len(node.values) > 1 and isinstance(node.values[0], ast.Constant) and _cuda_prefix(node.values[0].value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left = node.left
        while isinstance(left, ast.BinOp) and isinstance(left.op, ast.Add):
            left = left.left
        return isinstance(left, ast.Constant) and _cuda_prefix(left.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return isinstance(node.left, ast.Constant) and _cuda_prefix(node.left.value)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        return isinstance(node.func.value, ast.Constant) and _cuda_prefix(node.func.value.value)
    return False


_BACKEND_CALLS = ("init_process_group", "new_group", "new_subgroups", "new_subgroups_by_enumeration",
                  "split_group")
_NCCL = ("leave backend out (or torch.distributed.get_default_backend_for_device(device)): torch picks nccl on "
         "CUDA, vccl on vnpu, gloo on CPU")

_COMPUTED = (f"f\"{{device_type}}:{{i}}\" with device_type = {ACC}.type, or torch.device(device_type, i) "
             "(port mode maps the string where torch is given it)")
_DEVICE_OBJECT = (f"torch.device({ACC}.type, i): a torch.device('cuda', i) object is CUDA's wherever the script "
                  "keeps or compares it (port mode maps it only where torch is given it)")


_CUDA_MODULES = ("torch.cuda", "torch.backends.cudnn", "torch.backends.cuda")


def _imported_names(tree: ast.AST) -> dict[str, str]:
    """Local name -> the dotted torch name it is bound to by the module's imports (any scope): ``import torch as
    th`` -> {"th": "torch"}, ``from torch.cuda.amp import GradScaler`` -> {"GradScaler": "torch.cuda.amp.GradScaler"},
    ``import torch.cuda as tc`` -> {"tc": "torch.cuda"}. A static approximation: a later rebinding of the name
    (an assignment, a parameter) is not followed."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and (alias.name == "torch" or alias.name.startswith("torch.")):
                    names[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module == "torch" or node.module.startswith("torch."):
                for alias in node.names:
                    if alias.name != "*":
                        names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                    else:
                        for star in _STAR_NAMES.get(node.module, ()):
                            names.setdefault(star, f"{node.module}.{star}")
    return names


def _cuda_replacement(name: str) -> str | None:
    """The replacement for a resolved dotted name under torch.cuda / torch.backends.cud*, else None."""
    if name == "torch.cuda":
        return "torch.get_device_module(device) (the device's module; or torch.accelerator)"
    if name == "torch.cuda.amp":
        return "torch.amp (torch.autocast(device.type), torch.amp.GradScaler(device.type))"
    if name in ("torch.backends.cudnn", "torch.backends.cuda") or name.startswith(("torch.backends.cudnn.",
                                                                                  "torch.backends.cuda.")):
        return "cuDNN/CUDA setting: no effect on other devices (keep or remove)"
    if name.startswith("torch.cuda."):
        rest = name[len("torch.cuda."):]
        replacement = _CUDA_REPLACEMENTS.get(rest)
        if replacement is None and rest.endswith("Tensor"):  # torch.cuda.FloatTensor & co: CUDA-only classes
            return "torch.tensor(..., dtype=..., device=device) / x.to(device, dtype) (typed tensor classes are CUDA's)"
        if replacement is None:
            replacement = _CUDA_REPLACEMENTS.get(rest.split(".")[0], f"torch.get_device_module(device).{rest}")
        return replacement
    return None


_LIGHTNING_ACCELERATOR = ("accelerator='auto' (Lightning picks the available accelerator: CUDA on a GPU machine, "
                          "vnpu through torch_vnpu's Lightning adapter)")


class _Visitor(ast.NodeVisitor):
    def __init__(self, path: str, source: str, imports: dict[str, str]) -> None:
        self.path, self.source, self.findings = path, source, []
        self.imports = imports
        self._seen: set[int] = set()  # nodes reported as part of a larger finding

    def _add(self, node: ast.AST, replacement: str) -> None:
        code = ast.get_source_segment(self.source, node) or ""
        code = " ".join(code.split())
        code = code if len(code) <= 70 else code[:67] + "..."
        self.findings.append(Finding(self.path, node.lineno, node.col_offset, code, replacement))
        for child in ast.walk(node):
            self._seen.add(id(child))

    def _resolve(self, node: ast.AST) -> str | None:
        """The dotted name of a Name/Attribute chain, its head resolved through the module's imports."""
        name = _dotted(node)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        head = self.imports.get(head, head)
        return f"{head}.{rest}" if rest else head

    def _import(self, node: ast.Import | ast.ImportFrom, full_names: list[tuple[str, str]]) -> None:
        parts = [f"{local}: {r}" for local, full in full_names
                 if (r := _cuda_replacement(full)) is not None and full != "torch.backends.cudnn"]
        if parts:
            self._add(node, "; ".join(parts))

    def visit_Import(self, node: ast.Import) -> None:
        self._import(node, [(a.asname, a.name) for a in node.names if a.asname])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if not node.level and node.module and (node.module == "torch" or node.module.startswith("torch.")):
            if any(a.name == "*" for a in node.names) and _cuda_replacement(node.module) is not None:
                self._add(node, f"import what you use by name; {node.module}: {_cuda_replacement(node.module)}")
                return
            self._import(node, [(a.asname or a.name, f"{node.module}.{a.name}") for a in node.names if a.name != "*"])

    def visit_Compare(self, node: ast.Compare) -> None:
        if id(node) not in self._seen and any(isinstance(n, ast.Constant) and n.value == "nccl"
                                              for n in [node.left, *node.comparators]):
            self._add(node, "compare with torch.distributed.get_default_backend_for_device(device) (the backend "
                            "of the device you use: nccl on CUDA, vccl on vnpu)")
            return
        if id(node) not in self._seen and any(_is_cuda_string(n) or _is_computed_cuda_string(n)
                                              for n in [node.left, *node.comparators]):
            self._add(node, f"compare the type of the device you use, e.g. device_type = {ACC}.type "
                            "(a string compare with 'cuda' is False on any other accelerator)")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if id(node) not in self._seen:
            func = self._resolve(node.func)
            if isinstance(node.func, ast.Attribute) and node.func.attr == "cuda" and func != "torch.cuda":
                self._add(node, f".to(device) with device = {ACC}")
            elif func == "torch.device" and node.args and _is_cuda_string(node.args[0]):
                self._add(node, f"{ACC} (or torch.device(torch.accelerator.current_accelerator().type, i))")
            elif func == "torch.device" and node.args and _is_computed_cuda_string(node.args[0]):
                self._add(node, _DEVICE_OBJECT)
            elif _is_computed_cuda_string(node):
                self._add(node, _COMPUTED)
            if func and func.split(".")[-1] in _BACKEND_CALLS:
                backend = (node.args[0] if node.args and func.split(".")[-1] == "init_process_group"
                           else next((k.value for k in node.keywords if k.arg == "backend"), None))
                if (isinstance(backend, ast.Constant) and isinstance(backend.value, str)
                        and "nccl" in backend.value and id(backend) not in self._seen):
                    self._add(backend, _NCCL)
            if func and func.split(".")[-1] == "is_nccl_available" and func.startswith("torch.distributed"):
                self._add(node, "torch.distributed.is_backend_available(torch.distributed."
                                "get_default_backend_for_device(device)) (nccl exists only for CUDA)")
            for kw in node.keywords:
                if (kw.arg == "accelerator" and isinstance(kw.value, ast.Constant)
                        and kw.value.value in ("gpu", "cuda") and id(kw.value) not in self._seen):
                    self._add(kw.value, _LIGHTNING_ACCELERATOR)
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = self._resolve(node)
        if id(node) not in self._seen and name:
            replacement = _cuda_replacement(name)
            if replacement is not None and name not in ("torch.backends.cudnn", "torch.backends.cuda"):
                self._add(node, replacement)
                return
            if name == "torch.distributed.Backend.NCCL" or (node.attr == "NCCL" and name.endswith("Backend.NCCL")):
                self._add(node, _NCCL)
                return
            if node.attr == "is_cuda":
                self._add(node, "x.device.type == device.type (is_cuda is False on any other accelerator)")
                return
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        # A name imported from torch.cuda (``GradScaler(...)`` after ``from torch.cuda.amp import GradScaler``),
        # or bound to torch.cuda itself, used on its own.
        full = self.imports.get(node.id)
        if id(node) not in self._seen and full and isinstance(node.ctx, ast.Load):
            replacement = _cuda_replacement(full)
            if replacement is not None:
                self._add(node, replacement)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        if id(node) not in self._seen and _is_computed_cuda_string(node):
            self._add(node, _COMPUTED)
            return
        for value in node.values:  # the literal parts are not strings of their own ("{x}cuda" is no device)
            if isinstance(value, ast.FormattedValue):
                self.visit(value.value)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if id(node) not in self._seen and _is_computed_cuda_string(node):
            self._add(node, _COMPUTED)
            return
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if id(node) not in self._seen and _is_cuda_string(node):
            self._add(node, f"{ACC} (the current accelerator; its .type for a device-type string)")
        elif id(node) not in self._seen and node.value == "CUDA_VISIBLE_DEVICES":
            self._add(node, "the device's own variable (VNPU_VISIBLE_DEVICES on vnpu), or select devices with "
                            "torch.accelerator.set_device_index(i)")


def check_source(source: str, path: str = "<string>") -> list[Finding]:
    """Findings for one Python source text. Raises ``SyntaxError`` if it does not parse."""
    tree = ast.parse(source, filename=path)
    visitor = _Visitor(path, source, _imported_names(tree))
    visitor.visit(tree)
    return sorted(visitor.findings, key=lambda f: (f.line, f.col))


def _files(paths: list[str]) -> Iterator[str]:
    for p in paths:
        if os.path.isdir(p):
            for root, _, names in os.walk(p):
                yield from (os.path.join(root, n) for n in sorted(names) if n.endswith(".py"))
        else:
            yield p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    count, checked, failed = 0, 0, 0
    for path in _files(argv):
        try:
            with open(path, encoding="utf-8") as f:
                findings = check_source(f.read(), path)
        except SyntaxError as e:
            where = f"{path}:{e.lineno}:{e.offset}" if e.lineno else path
            print(f"{where}: cannot check: SyntaxError: {e.msg}", file=sys.stderr)
            failed += 1
            continue
        except (OSError, UnicodeDecodeError) as e:
            print(f"{path}: cannot check: {e}", file=sys.stderr)
            failed += 1
            continue
        checked += 1
        for finding in findings:
            print(finding)
        count += len(findings)
    if failed:
        # Never "nothing to change" when a file could not be read: the summary covers only the files checked.
        if checked:
            print(f"{count} hard-coded CUDA use(s) found in the {checked} file(s) checked; {failed} file(s) could "
                  "not be checked")
        return 2
    print(f"{count} hard-coded CUDA use(s) found" + ("" if count else "; nothing to change"))
    return 1 if count else 0


if __name__ == "__main__":
    raise SystemExit(main())
