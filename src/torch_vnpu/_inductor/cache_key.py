"""vnpu's post-grad pass, and vnpu's part of the keys of Inductor's FX graph cache.

The pass (Inductor runs it on every graph with vnpu tensors) replaces the
flex_attention ops that CPU's C++ template cannot lower (:mod:`.flex_attention`).

A cached compiled graph is the generated Python wrapper, which calls vnpu's
kernel bindings with vnpu's calling convention (:mod:`.kernel_launch`). Inductor
puts the ``uuid()`` of every registered device pass into its cache keys, so
the pass's uuid, the hash of this package's sources, makes graphs
cached by another torch_vnpu version miss instead of being reused.
"""

from __future__ import annotations

import functools
import pathlib

from torch._inductor.custom_graph_pass import CustomGraphModulePass, get_hash_for_files


@functools.cache
def _sources_hash() -> bytes:
    here = pathlib.Path(__file__).parent
    return get_hash_for_files(tuple(str(p) for p in sorted(here.glob("*.py"))), extra="torch_vnpu._inductor")


class VnpuCodegenVersion(CustomGraphModulePass):
    """Post-grad pass for vnpu graphs; see the module docstring."""

    def __call__(self, gm) -> None:
        from .flex_attention import decompose_for_training

        decompose_for_training(gm)

    def uuid(self) -> bytes:
        return _sources_hash()
