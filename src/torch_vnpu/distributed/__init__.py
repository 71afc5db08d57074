"""torch_vnpu.distributed: ``vccl``, the collectives backend of vnpu for ``torch.distributed``.

Importing torch_vnpu registers it (``torch.distributed.Backend.register_backend("vccl", ...,
devices=["vnpu"])``), so with one process per device under ``torchrun``:

    torch.vnpu.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group()            # vnpu tensors -> vccl, cpu tensors -> gloo
    dist.all_reduce(torch.ones(4, device="vnpu"))

and ``init_device_mesh("vnpu", ...)``, DDP, FSDP2, DTensor, pipelining and DCP run on vnpu.
``init_process_group(backend="vccl")`` gives a vnpu-only group; ``"cpu:gloo,vnpu:vccl"`` is the
default when no backend is named.

Semantics mirror NCCL's (see Note [vccl execution model] in csrc/distributed/ProcessGroupVCCL.h):
collectives are ordered on the current vnpu stream and return at once; ``Work.wait()`` makes the
current stream wait (no host block); ``barrier()`` blocks the host. Errors of an operation raise at
``wait()`` when already known, else at the stream's next synchronization (``torch.AcceleratorError``
naming the collective). Every collective's arguments are compared across ranks before data moves
(``VNPU_VCCL_CHECK=0`` turns that off). Transport: shared memory between the processes of one host (peers map each other's device memory), Gloo over TCP
on CPU aliases of device memory across hosts and for point-to-point transfers.
"""

from __future__ import annotations

import os
import warnings
import datetime

import torch

__all__ = ["ProcessGroupVCCL", "is_vccl_available"]

_registered = False


def is_vccl_available() -> bool:
    """True when torch.distributed is available (vccl needs it and Gloo)."""
    return torch.distributed.is_available() and torch.distributed.is_gloo_available()


def _bindings():
    from .. import _C

    return _C._init_distributed()


def __getattr__(name: str):
    if name == "ProcessGroupVCCL":
        return _bindings().ProcessGroupVCCL
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _new_gloo(store, rank: int, size: int, timeout: datetime.timedelta):
    from torch.distributed import ProcessGroupGloo

    from .. import _C

    # VNPU_SANITIZE check 4: Gloo's threads, started here, read and write device memory for vccl's Gloo
    # transport; threads inherit access to it from this one (a no-op without the sanitizer).
    _C._sanitizer_device_access(True)
    try:
        return ProcessGroupGloo(store, rank, size, timeout)
    finally:
        _C._sanitizer_device_access(False)


def _create_vccl(dist_opts, backend_options):
    """The creator torch.distributed calls (extended API) for each group that uses vccl."""
    from torch.distributed import PrefixStore

    C = _bindings()
    timeout = dist_opts.timeout
    if isinstance(backend_options, C.ProcessGroupVCCL.Options):
        options = backend_options
    elif backend_options is None:
        options = C.ProcessGroupVCCL.Options()
    else:
        raise TypeError(
            f"vccl: pg_options must be a ProcessGroupVCCL.Options, got {type(backend_options).__name__}"
        )
    flag = os.environ.get("VNPU_VCCL_CHECK")
    if flag not in (None, "0", "1"):  # PyTorch's boolean rule (Note [Boolean environment variables])
        warnings.warn(f"Ignoring invalid value for boolean flag VNPU_VCCL_CHECK: '{flag}'; valid values are 0 or 1 "
                      "(as PyTorch's own flags). Using the default (1).", UserWarning, stacklevel=2)
    options._timeout = timeout
    options.group_name = dist_opts.group_id
    options.global_ranks_in_group = list(dist_opts.global_ranks_in_group)
    store = dist_opts.store
    gloo = _new_gloo(PrefixStore("gloo/", store), dist_opts.group_rank, dist_opts.group_size, timeout)
    return C.ProcessGroupVCCL(store, dist_opts.group_rank, dist_opts.group_size, options, gloo)


def _register() -> None:
    """Registers vccl with torch.distributed (idempotent; called when torch_vnpu is imported)."""
    global _registered
    if _registered or not is_vccl_available():
        return
    from torch.distributed import Backend

    from . import _compat

    _bindings()._set_gloo_factory(_new_gloo)
    # vccl's future-completion threads run Python callbacks: stop them before the interpreter finalizes.
    import atexit

    atexit.register(_bindings()._stop_future_completions)
    Backend.register_backend("vccl", _create_vccl, extended_api=True, devices=["vnpu"])
    _compat.install()
    from .._import_hooks import when_imported
    from . import dtensor_attention

    # DTensor is not imported by `import torch`: its strategies are added when it is.
    when_imported("torch.distributed.tensor", dtensor_attention.register)
    _registered = True
