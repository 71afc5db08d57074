"""Global modes take effect as of the call on vnpu (docs: "Global modes").

ATen's CPU kernels, which vnpu runs on its stream workers, read process-global flags of ``at::Context``
(deterministic algorithms and their warn-only mode, float32 matmul precision, the mkldnn/onednn switches, ...)
when they run, which on an asynchronous device may be long after the op was called. Every setter of such a
flag is wrapped here so that it first waits until all work already queued on vnpu has run (a pending kernel
error stays pending for the next synchronization): each kernel then runs under the modes in force at its call,
as on CPU and CUDA. ``torch.set_flush_denormal`` is per thread; its value is also handed to the stream
workers. See Note [Host modes take effect as of the call] (csrc/ops/HostModes.h).

Setters are rare (a training script calls them once), so one wait per change costs nothing measurable.
"""
import functools
import sys

import torch

from . import record, replace

_ID = "host-modes.setters-wait"

# torch._C setters of state that CPU kernels (or the kernels they dispatch to) read while running.
_C_SETTERS = (
    "_set_deterministic_algorithms",
    "_set_deterministic_fill_uninitialized_memory",
    "_set_float32_matmul_precision",
    "_set_fp32_precision_setter",  # returns a setter: wrapped below too
    "_set_cpu_allow_fp16_reduced_precision_reduction",
    "_set_math_sdp_allow_fp16_bf16_reduction",
    "_set_mkldnn_enabled",
    "_set_mkldnn_deterministic",
    "_set_onednn_allow_tf32",
    "_set_nnpack_enabled",
    "_set_default_dtype",
    "_set_default_tensor_type",
    "_set_qengine",
    "_set_check_sparse_tensor_invariants",
    "set_flush_denormal",
)


def _wait_queued_work() -> None:
    from .. import _C

    if _C._is_initialized():
        _C._wait_all_devices_idle()


def _draining(setter):
    if getattr(setter, "_vnpu_drains", False):
        return setter

    @functools.wraps(setter)
    def wrapper(*args, **kwargs):
        _wait_queued_work()
        return setter(*args, **kwargs)

    wrapper._vnpu_drains = True
    return wrapper


def _flush_denormal(setter):
    @functools.wraps(setter)
    def set_flush_denormal(mode):
        from .. import _C

        _wait_queued_work()
        supported = setter(mode)
        if supported:
            _C._set_worker_flush_denormal(bool(mode))
        return supported

    set_flush_denormal._vnpu_drains = True
    return set_flush_denormal


def _precision_setter_factory(factory):
    @functools.wraps(factory)
    def make(*args, **kwargs):
        return _draining(factory(*args, **kwargs))

    make._vnpu_drains = True
    return make


def _wrap(name):
    original = getattr(torch._C, name, None)
    if original is None or getattr(original, "_vnpu_drains", False):
        return original, original
    if name == "set_flush_denormal":
        wrapped = _flush_denormal(original)
    elif name == "_set_fp32_precision_setter":
        wrapped = _precision_setter_factory(original)
    else:
        wrapped = _draining(original)
    replace(torch._C, name, wrapped, _ID)
    return original, wrapped


def install() -> None:
    """Wraps the setters (torch._C's, torch's re-exports of them, and the ``torch.backends`` properties built on
    them at import). Idempotent."""
    replaced = {}
    for name in _C_SETTERS:
        original, wrapped = _wrap(name)
        if original is not None and original is not wrapped:
            replaced[id(original)] = wrapped
    if getattr(torch.set_flush_denormal, "_vnpu_drains", False) is False:
        replace(torch, "set_flush_denormal", torch._C.set_flush_denormal, _ID)
    # torch.backends.* flags are ContextProp descriptors holding the setter they were built with (a torch._C
    # function, or a closure from _set_fp32_precision_setter): wrap every one of them.
    from torch.backends import ContextProp

    for mod_name, mod in list(sys.modules.items()):
        if not mod_name.startswith("torch.backends") or mod is None:
            continue
        for attr in list(vars(type(mod)).values()):
            if isinstance(attr, ContextProp) and not getattr(attr.setter, "_vnpu_drains", False):
                attr.setter = replaced.get(id(attr.setter)) or _draining(attr.setter)
                record(_ID, f"{mod_name}.ContextProp setter")
