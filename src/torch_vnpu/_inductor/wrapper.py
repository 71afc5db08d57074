"""Inductor's Python wrapper code generator for vnpu graphs.

The generated ``call()`` runs on the calling thread, as for CPU: it allocates
buffers (``empty_strided(..., device='vnpu')``, i.e. the caching allocator on the
current stream) and calls extern kernels, which the eager executor enqueues on
the current stream. Two things differ from CPU: fused C++ kernels are defined
with the vnpu binding (:mod:`.kernel_launch`), and each call passes the kernel's
name and device index first, so the kernel is enqueued on that device's current
stream instead of running on the host.
"""

from __future__ import annotations

import warnings

import torch
from torch._inductor import config
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.virtualized import V

from . import graph_trees
from .scheduling import VNPU_KERNEL_MARK

_CPU_BINDING = "async_compile.cpp_pybinding("
_VNPU_BINDING = "vnpu_cpp_pybinding(async_compile, "


def _graph_label() -> str:
    """Which compiled graph a kernel belongs to, for error messages ("0/0 forward")."""
    parts = []
    compile_id = torch._guards.CompileContext.current_compile_id()
    if compile_id is not None:
        parts.append(f"compiled graph {compile_id}")
    tracing = torch._guards.TracingContext.try_get()
    if tracing is not None and tracing.aot_graph_name:
        parts.append(" ".join(tracing.aot_graph_name))
    return ", ".join(parts) or "compiled graph"


class _VnpuKernelCalls:
    """Kernel definition and call lines for vnpu (shared by graph and subgraph wrappers)."""

    def define_kernel(self, kernel_name, kernel_body, metadata=None, gpu=True, cpp_definition=None):
        if not gpu and kernel_body.startswith(_CPU_BINDING) and VNPU_KERNEL_MARK in kernel_body:
            kernel_body = _VNPU_BINDING + kernel_body[len(_CPU_BINDING):]
        super().define_kernel(kernel_name, kernel_body, metadata=metadata, gpu=gpu, cpp_definition=cpp_definition)

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True, **kwargs):
        device = device or V.graph.get_current_device_or_throw()
        if triton or device.type != "vnpu":
            return super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton, **kwargs)
        index = device.index if device.index is not None else torch.vnpu.current_device()
        launch_name = f"{kernel_name} ({_graph_label()})"
        self.writeline(self.wrap_kernel_call(kernel_name, [repr(launch_name), str(index), *call_args]))


class VnpuPythonWrapperCodegen(_VnpuKernelCalls, PythonWrapperCodegen):
    """``PythonWrapperCodegen`` whose fused kernels are launched on the current vnpu stream."""

    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        if is_subgraph:
            assert subgraph_name is not None and parent_wrapper is not None
            return VnpuSubgraphPythonWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        if config.triton.cudagraphs and not graph_trees.is_applied():
            warnings.warn(
                "CUDA graphs (torch.compile mode='reduce-overhead' or 'max-autotune') are not recorded for vnpu in "
                "this process (torch is built with CUDA, or an earlier warning said why): the graph runs without "
                "them, each kernel launched on the current vnpu stream",
                UserWarning,
            )
        return VnpuPythonWrapperCodegen()

    def write_header(self) -> None:
        super().write_header()
        self.imports.writeline("from torch_vnpu._inductor.kernel_launch import cpp_pybinding as vnpu_cpp_pybinding")


class VnpuSubgraphPythonWrapperCodegen(_VnpuKernelCalls, SubgraphPythonWrapperCodegen):
    """Subgraphs (cond, while_loop, invoke_subgraph) of a vnpu graph; the header is the parent's."""
