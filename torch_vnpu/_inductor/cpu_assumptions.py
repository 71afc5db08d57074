"""Two places where Inductor 2.13 equates "C++ backend" with ``device.type == "cpu"``.

Both are narrowed to vnpu here (idempotent; nothing changes for other devices):

1. ``torch._inductor.utils.get_current_backend`` maps every device it does not
   know to ``config.cuda_backend`` ("triton"), so ``CSEProxy`` takes Triton's
   branch for masked loads in C++ kernels and training graphs (e.g. the cross
   entropy backward) fail in ``CppVecKernel``. vnpu's backend is "cpp".
2. ``BaseSchedulerNode.is_cpu`` gates three fusion-time loop rewrites that
   only Triton's SIMD kernels support (loop reordering, index inversion,
   reindexing pointwise nodes for reductions): for vnpu nodes it must answer
   as for CPU ones, or the scheduler fails on C++ kernels.
"""

from __future__ import annotations

import sys

_DEVICE = "vnpu"


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

    get_current_backend._vnpu_original = original  # type: ignore[attr-defined]
    get_current_backend.__doc__ = original.__doc__
    # Inductor modules bind the function by name (`from ..utils import get_current_backend`).
    for name, module in list(sys.modules.items()):
        if name.startswith("torch._inductor") and getattr(module, "get_current_backend", None) is original:
            module.get_current_backend = get_current_backend


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
    """Applies both fixes (idempotent)."""
    _fix_get_current_backend()
    _fix_is_cpu()
