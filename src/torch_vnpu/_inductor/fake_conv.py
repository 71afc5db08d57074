"""Fake (meta) convolutions of vnpu tensors take the memory format vnpu's real convolution gives.

vnpu runs ATen's CPU convolution (csrc/ops/Overrides.cpp), whose output follows
a channels-last input (CPU's rule: mkldnn / thnn channels-last checks). The
FakeTensor rule for convolutions (``torch._subclasses.fake_impls.conv``, used by
torch.compile, torch.export and AOTInductor) asks ATen which backend the
*fake* device would pick; for a PrivateUse1 device that is "overrideable",
whose format is always contiguous. Traced graphs then expected contiguous
outputs where vnpu produces channels-last ones (Inductor read a conv's output
with the wrong strides: cpu_assumptions item 7).

Here the four convolution ops' fake rule runs with vnpu inputs presented as
CPU tensors (same sizes, strides, dtype), so it answers CPU's format, and the
results are put back on the vnpu device. Mixed-device calls keep the original
rule (and its device errors).
"""

from __future__ import annotations

from types import ModuleType

_DEVICE = "vnpu"


def _fake_tensors(values) -> list:
    from torch._subclasses.fake_tensor import FakeTensor

    found = []
    for v in values:
        if isinstance(v, FakeTensor):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            found.extend(_fake_tensors(v))
    return found


def patch(fake_impls: ModuleType) -> None:
    """Wraps the fake rule of aten.convolution / _convolution / convolution_backward (idempotent)."""
    import torch

    from ..patches import record

    aten = torch.ops.aten
    table = fake_impls.op_implementations_dict
    cpu = torch.device("cpu")
    for op in (aten.convolution.default, aten._convolution.default, aten._convolution.deprecated,
               aten.convolution_backward.default):
        original = table.get(op)
        if original is None or getattr(original, "_vnpu_original", None) is not None:
            continue

        def conv(fake_mode, func, *args, _original=original, **kwargs):
            inputs = _fake_tensors(args) + _fake_tensors(kwargs.values())
            devices = {t.fake_device for t in inputs}
            if len(devices) != 1 or next(iter(devices)).type != _DEVICE:
                return _original(fake_mode, func, *args, **kwargs)
            device = next(iter(devices))
            for t in inputs:
                t.fake_device = cpu
            try:
                out = _original(fake_mode, func, *args, **kwargs)
            finally:
                for t in inputs:
                    t.fake_device = device
            for t in _fake_tensors(out if isinstance(out, tuple) else (out,)):
                t.fake_device = device
            return out

        conv._vnpu_original = original  # type: ignore[attr-defined]
        conv.__doc__ = original.__doc__
        table[op] = conv
        record("fake-conv.memory-format", f"torch._subclasses.fake_impls.op_implementations_dict[{op}]")
