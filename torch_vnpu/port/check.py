"""``python -m torch_vnpu.port.check file.py [dir ...]``: list the hard-coded CUDA calls of Python sources, with
``file:line:column`` and the device-agnostic replacement (``torch.accelerator``, ``torch.amp``,
``torch.get_device_module``), for users who prefer fixing their code to running it under port mode.

Static (``ast``; nothing is imported or run). Reports: ``"cuda"``/``"cuda:i"`` string constants (device
arguments, ``torch.device("cuda")``, comparisons such as ``'cuda' in device``), ``.cuda()`` calls,
``torch.cuda.*`` uses (including ``torch.cuda.amp.autocast`` / ``GradScaler``), ``.is_cuda``, and
``torch.backends.cudnn`` / ``torch.backends.cuda`` settings (harmless elsewhere: noted, not needed). Exit status 0: nothing found; 1: findings; 2: a file could
not be read or parsed.
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


class _Visitor(ast.NodeVisitor):
    def __init__(self, path: str, source: str) -> None:
        self.path, self.source, self.findings = path, source, []
        self._seen: set[int] = set()  # nodes reported as part of a larger finding

    def _add(self, node: ast.AST, replacement: str) -> None:
        code = ast.get_source_segment(self.source, node) or ""
        code = code if len(code) <= 70 else code[:67] + "..."
        self.findings.append(Finding(self.path, node.lineno, node.col_offset, code, replacement))
        for child in ast.walk(node):
            self._seen.add(id(child))

    def visit_Compare(self, node: ast.Compare) -> None:
        if id(node) not in self._seen and any(_is_cuda_string(n) for n in [node.left, *node.comparators]):
            self._add(node, f"compare the type of the device you use, e.g. device_type = {ACC}.type "
                            "(a string compare with 'cuda' is False on any other accelerator)")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if id(node) not in self._seen:
            func = _dotted(node.func)
            if isinstance(node.func, ast.Attribute) and node.func.attr == "cuda" and func != "torch.cuda":
                self._add(node, f".to(device) with device = {ACC}")
            elif func in ("torch.device",) and node.args and _is_cuda_string(node.args[0]):
                self._add(node, f"{ACC} (or torch.device(torch.accelerator.current_accelerator().type, i))")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = _dotted(node)
        if id(node) not in self._seen and name:
            for prefix in ("torch.cuda.", "torch.backends.cudnn.", "torch.backends.cuda."):
                if name.startswith(prefix):
                    rest = name[len(prefix):]
                    if prefix.startswith("torch.backends."):
                        self._add(node, "cuDNN/CUDA setting: no effect on other devices (keep or remove)")
                    else:
                        replacement = _CUDA_REPLACEMENTS.get(rest)
                        if replacement is None:
                            head = rest.split(".")[0]
                            replacement = _CUDA_REPLACEMENTS.get(head, f"torch.get_device_module(device).{rest}")
                        self._add(node, replacement)
                    return
            if node.attr == "is_cuda":
                self._add(node, "x.device.type == device.type (is_cuda is False on any other accelerator)")
                return
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if id(node) not in self._seen and _is_cuda_string(node):
            self._add(node, f"{ACC} (the current accelerator; its .type for a device-type string)")


def check_source(source: str, path: str = "<string>") -> list[Finding]:
    """Findings for one Python source text. Raises ``SyntaxError`` if it does not parse."""
    visitor = _Visitor(path, source)
    visitor.visit(ast.parse(source, filename=path))
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
    status, count = 0, 0
    for path in _files(argv):
        try:
            with open(path, encoding="utf-8") as f:
                findings = check_source(f.read(), path)
        except (OSError, SyntaxError, UnicodeDecodeError) as e:
            print(f"{path}: cannot check: {e}", file=sys.stderr)
            status = 2
            continue
        for finding in findings:
            print(finding)
        count += len(findings)
    print(f"{count} hard-coded CUDA use(s) found" + ("" if count else "; nothing to change"))
    return status or (1 if count else 0)


if __name__ == "__main__":
    raise SystemExit(main())
