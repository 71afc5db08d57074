"""Inductor's C++ wrapper (``torch._inductor.config.cpp_wrapper = True``) for vnpu: not supported yet."""

from __future__ import annotations

from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu


class VnpuCppWrapperCodegen(CppWrapperCpu):
    """Raises NotImplementedError: vnpu graphs need the Python wrapper (``cpp_wrapper=False``, the default)."""

    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        raise NotImplementedError(
            "torch._inductor.config.cpp_wrapper=True is not supported on vnpu yet; compile with "
            "cpp_wrapper=False (the default): the Python wrapper launches the same C++ kernels on the vnpu stream"
        )
