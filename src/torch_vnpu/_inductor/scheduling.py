"""Inductor's kernel scheduling for vnpu: the C++ (OpenMP + ATen vectorisation) backend of CPU.

vnpu kernels are host code (device memory is host-addressable by the runtime's
design), so Inductor's CPU code generator is used unchanged; only where a
kernel runs differs (:mod:`.wrapper`, :mod:`.kernel_launch`).
"""

from __future__ import annotations

from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.scheduler import NopKernelSchedulerNode

# First line of every vnpu kernel's source. The wrapper defines kernels that carry it with the vnpu
# binding (stream launch), and it keeps a vnpu kernel from being deduplicated with an identical CPU kernel
# of the same graph (e.g. an optimizer's CPU step counters), which must keep running on the host.
VNPU_KERNEL_MARK = "// vnpu kernel: enqueued on the current vnpu stream (torch_vnpu/_inductor/kernel_launch.py)"


class VnpuScheduling(CppScheduling):
    """``CppScheduling`` for the vnpu nodes of a graph (the kernels Inductor generates for CPU)."""

    def define_kernel(self, src_code, nodes, kernel_args=None):
        return super().define_kernel(f"{VNPU_KERNEL_MARK}\n{src_code}", nodes, kernel_args)

    def codegen_node(self, node):
        super().codegen_node(node)
        # CppScheduling groups consecutive nodes into one kernel and flushes it before the next node of
        # another device or an extern node. Device-less nodes (an event recorded inside the graph:
        # streams.record_event) flush nothing, so the pending kernel was emitted after them, after the
        # buffers it reads had been deleted. In graphs with such nodes, every kernel is emitted at once.
        if self._graph_has_deviceless_ops():
            self._set_flush_status(True)

    def _graph_has_deviceless_ops(self) -> bool:
        scheduler = self.scheduler
        if getattr(self, "_deviceless_for", None) is not scheduler:
            self._deviceless_for = scheduler
            self._deviceless = any(
                n.get_device() is None and not isinstance(n, NopKernelSchedulerNode) for n in scheduler.nodes
            )
        return self._deviceless
