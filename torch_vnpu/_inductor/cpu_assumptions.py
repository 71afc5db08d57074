"""Three places where Inductor 2.13 assumes that a device which is not a GPU is the CPU.

Each is narrowed to vnpu here (idempotent; nothing changes for other devices):

1. ``torch._inductor.utils.get_current_backend`` maps every device it does not
   know to ``config.cuda_backend`` ("triton"), so ``CSEProxy`` takes Triton's
   branch for masked loads in C++ kernels and training graphs (e.g. the cross
   entropy backward) fail in ``CppVecKernel``. vnpu's backend is "cpp".
2. ``BaseSchedulerNode.is_cpu`` gates three fusion-time loop rewrites that
   only Triton's SIMD kernels support (loop reordering, index inversion,
   reindexing pointwise nodes for reductions): for vnpu nodes it must answer
   as for CPU ones, or the scheduler fails on C++ kernels.
3. ``torch._inductor.utils.device_need_guard`` is true for GPUs only, so a
   vnpu graph's code has no device guard and its ``empty_strided(...,
   device='vnpu')`` allocations land on the current device, not the graph's
   (a graph on vnpu:1 called while vnpu:0 is current failed with a device
   mismatch). vnpu has devices like a GPU: its graphs get a device guard.
"""

from __future__ import annotations

import sys
from typing import Callable

_DEVICE = "vnpu"


def _rebind(name: str, original: Callable, replacement: Callable) -> None:
    """Replaces ``torch._inductor.utils.<name>`` in every Inductor module that bound it by name."""
    replacement._vnpu_original = original  # type: ignore[attr-defined]
    replacement.__doc__ = original.__doc__
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("torch._inductor") and getattr(module, name, None) is original:
            setattr(module, name, replacement)


def _fix_get_current_backend() -> None:
    from torch._inductor import utils

    original = utils.get_current_backend
    if getattr(original, "_vnpu_original", None) is not None:
        return

    def get_current_backend(device_type: str | None = None) -> str:
        if not device_type:
            from torch._inductor.virtualized import V

            device_type = V.graph.get_current_device_or_throw().type
        return "cpp" if device_type == _DEVICE else original(device_type)

    _rebind("get_current_backend", original, get_current_backend)


def _fix_device_need_guard() -> None:
    from torch._inductor import scheduler, utils  # noqa: F401  (scheduler binds the name)

    original = utils.device_need_guard
    if getattr(original, "_vnpu_original", None) is not None:
        return

    def device_need_guard(device: str) -> bool:
        return device == _DEVICE or original(device)

    _rebind("device_need_guard", original, device_need_guard)


def _fix_is_cpu() -> None:
    from torch._inductor.scheduler import BaseSchedulerNode

    original = BaseSchedulerNode.is_cpu
    if getattr(original, "_vnpu_original", None) is not None:
        return

    def is_cpu(self) -> bool:
        device = self.get_device()
        return original(self) or (device is not None and device.type == _DEVICE)

    is_cpu._vnpu_original = original  # type: ignore[attr-defined]
    BaseSchedulerNode.is_cpu = is_cpu


def apply() -> None:
    """Applies the three fixes (idempotent)."""
    _fix_get_current_backend()
    _fix_is_cpu()
    _fix_device_need_guard()
