"""Inductor's kernel scheduling for vnpu: the C++ (OpenMP + ATen vectorisation) backend of CPU.

vnpu kernels are host code (device memory is host-addressable by the runtime's
design), so Inductor's CPU code generator is used unchanged; only where a
kernel runs differs (:mod:`.wrapper`, :mod:`.kernel_launch`).
"""

from __future__ import annotations

from torch._inductor.codegen.cpp import CppScheduling

# First line of every vnpu kernel's source. The wrapper defines kernels that carry it with the vnpu
# binding (stream launch), and it keeps a vnpu kernel from being deduplicated with an identical CPU kernel
# of the same graph (e.g. an optimizer's CPU step counters), which must keep running on the host.
VNPU_KERNEL_MARK = "// vnpu kernel: enqueued on the current vnpu stream (torch_vnpu/_inductor/kernel_launch.py)"


class VnpuScheduling(CppScheduling):
    """``CppScheduling`` for the vnpu nodes of a graph (the kernels Inductor generates for CPU)."""

    def define_kernel(self, src_code, nodes, kernel_args=None):
        return super().define_kernel(f"{VNPU_KERNEL_MARK}\n{src_code}", nodes, kernel_args)
