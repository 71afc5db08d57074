"""CPU's entries in torch's device-keyed policy tables, registered for vnpu.

vnpu computes with ATen's CPU kernels (docs/DESIGN.md, "Eager execution"), so wherever torch picks a numerics
policy by device type from a table that lists only ``cpu`` and ``cuda``, the CPU entry describes vnpu: e.g.
its float16/bfloat16 matrix products are CPU's fp32-upcast kernels. Without an entry torch uses the policy for
"a CUDA-like backend with hardware-native low-precision matmul", which on vnpu gives different (and less
accurate) results than the same code on CPU.

Tables handled (torch 2.13):
- ``torch.nn.modules.linear_cross_entropy_options``: ``_AUTO_DEFAULTS[(device type, dtype)]`` (chunking and
  accumulation policy of the chunked ``F.linear_cross_entropy``) and
  ``LinearCrossEntropyOptions._resolve_auto_acc_dtype`` (fp32 accumulation for fp16/bf16 inputs on cpu and
  capable cuda devices). Without them vnpu accumulated fp16 chunks in fp16 (differences ~4e-3 from CPU).
Upstream fix that removes this file: let a backend declare its policy (or key the tables by the kernels'
device rather than the tensor's).
"""
import functools

import torch

from . import record, replace

_ID = "cpu-policies.linear-cross-entropy"


def _linear_cross_entropy(device_type: str) -> None:
    try:
        from torch.nn.modules import linear_cross_entropy_options as lce
    except ImportError:  # a torch without chunked linear_cross_entropy
        return
    for dtype in (torch.float16, torch.bfloat16):
        if ("cpu", dtype) in lce._AUTO_DEFAULTS:
            lce._AUTO_DEFAULTS.setdefault((device_type, dtype), lce._AUTO_DEFAULTS[("cpu", dtype)])
            record(_ID, f"torch.nn.modules.linear_cross_entropy_options._AUTO_DEFAULTS[{device_type!r}, {dtype}]")
    cls = lce.LinearCrossEntropyOptions
    original = cls.__dict__["_resolve_auto_acc_dtype"].__func__
    if getattr(original, "_vnpu_wrapped", False):
        return

    @functools.wraps(original)
    def _resolve_auto_acc_dtype(dtype, device):
        if device is not None and device.type == device_type:
            device = torch.device("cpu")
        return original(dtype, device)

    _resolve_auto_acc_dtype._vnpu_wrapped = True
    replace(cls, "_resolve_auto_acc_dtype", staticmethod(_resolve_auto_acc_dtype), _ID)


def register(device_type: str) -> None:
    """Gives ``device_type`` CPU's entries in the tables listed in the module docstring. Idempotent."""
    _linear_cross_entropy(device_type)
