"""torch.compile for vnpu: Dynamo's device interface and Inductor's C++ backend, registered for vnpu.

How a compiled graph runs (see docs/ARCHITECTURE.md, "How a compiled graph
reaches the stream"): Inductor's CPU code generator emits the fused C++
kernels; the Python wrapper of the graph runs on the calling thread, allocates
from the vnpu caching allocator, calls extern kernels through the eager executor
and enqueues every fused kernel on the current vnpu stream. With
``torch._inductor.config.cpp_wrapper = True`` the same happens from C++
(:mod:`.cpp_wrapper`).

Registration is lazy, so ``import torch`` does not import Dynamo or Inductor
(torch 2.13 has no ``_inductor_backend_init`` hook):

* :func:`register_dynamo` runs when ``torch._dynamo.device_interface`` is first
  imported (an import hook installed by :mod:`.lazy`);
* :func:`register_inductor` runs when Inductor first registers its backends
  (``init_backend_registration``, at the first compilation), through a hook
  that :mod:`.lazy` installs when ``torch._inductor.codegen.common`` is imported.

Both are idempotent. ``torch.compile(m)`` (Inductor) and
``torch.compile(m, backend="vnpu")`` (the same, through the
``torch_dynamo_backends`` entry point) then work on vnpu tensors.
"""

from __future__ import annotations

_DEVICE = "vnpu"
_inductor_registered = False


def register_dynamo() -> None:
    """Registers the Dynamo device interface for ``vnpu`` (idempotent)."""
    from . import device_interface

    device_interface.register()


def register_inductor() -> None:
    """Registers vnpu's Inductor scheduling, wrapper code generators and device op overrides (idempotent)."""
    global _inductor_registered
    if _inductor_registered:
        return
    from torch._inductor.codegen.common import register_backend_for_device, register_device_op_overrides
    from torch._inductor.codegen.cpp_utils import DEVICE_TO_ATEN, DEVICE_TO_INT

    from . import aoti, cpu_assumptions, flex_attention, graph_trees
    from .cache_key import VnpuCodegenVersion
    from .codegen import CODEGEN_CLASSES
    from .device_op_overrides import VnpuDeviceOpOverrides

    register_dynamo()
    cpu_assumptions.apply()
    aoti.apply()
    graph_trees.apply()
    # The C++ wrapper's device constant (aoti_torch_device_type_privateuse1()); vnpu is PrivateUse1.
    DEVICE_TO_ATEN.setdefault(_DEVICE, "at::kPrivateUse1")
    # AOTInductor's input device check (AOTI_RUNTIME_CHECK_INPUTS=1): c10::DeviceType::PrivateUse1.
    DEVICE_TO_INT.setdefault(_DEVICE, 20)
    from ..patches import record

    record("inductor.cpp-device-tables", "torch._inductor.codegen.cpp_utils.DEVICE_TO_ATEN/DEVICE_TO_INT['vnpu']")
    register_device_op_overrides(_DEVICE, VnpuDeviceOpOverrides())
    flex_attention.register_lowering()
    register_backend_for_device(
        _DEVICE,
        CODEGEN_CLASSES["Scheduling"],
        CODEGEN_CLASSES["PythonWrapperCodegen"],
        CODEGEN_CLASSES["CppWrapperCodegen"],
        CODEGEN_CLASSES["WrapperFxCodegen"],
        device_custom_pass=VnpuCodegenVersion(),
    )
    _inductor_registered = True


def codegen_class(name: str):
    """``torch.vnpu.<name>`` for the code generator classes Inductor discovers (registers Inductor first)."""
    register_inductor()
    from .codegen import CODEGEN_CLASSES

    return CODEGEN_CLASSES[name]


CODEGEN_NAMES = ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen")
