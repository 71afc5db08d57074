"""Inductor's FX wrapper (``torch._inductor.config.fx_wrapper = True``) for vnpu: not supported."""

from __future__ import annotations

from torch._inductor.codegen.wrapper_fxir import WrapperFxCodegen


class VnpuWrapperFxCodegen(WrapperFxCodegen):
    """Raises NotImplementedError: the FX wrapper calls C++ kernels on the host, outside stream order."""

    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        raise NotImplementedError(
            "torch._inductor.config.fx_wrapper=True is not supported on vnpu; compile with fx_wrapper=False "
            "(the default)"
        )
