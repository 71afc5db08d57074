"""Workarounds in torch 2.13's torch.distributed for an accelerator whose backend is a plugin.

Each patch wraps one torch function and changes only the vnpu/vccl case:

1. ``BackendConfig`` for ``init_process_group()`` with no backend: upstream maps only the accelerator
   (``{"vnpu": "vccl"}``), so cpu tensors (object collectives, cpu barriers, DCP metadata) would have no
   backend. vnpu gets ``{"cpu": "gloo", "vnpu": "vccl"}``, like the explicit "cpu:gloo,vnpu:vccl".
2. ``_new_process_group_helper``: the group's *default* backend type (used by C++ for sequence numbers,
   ``waitForPendingWorks``, symmetric-memory rendezvous) may name a type no backend of the group has:
   GLOO when only vccl exists, or UNDEFINED for "cpu:gloo,vnpu:vccl" (the plugin check compares
   ``"VCCL"`` with ``"vccl"``). Then ``ProcessGroup::getDefaultBackend()`` throws "Could not find the
   default backend type". The default is set to a registered backend (gloo if the group has it, else
   vccl). Upstream fixed this in pytorch#179901 (after 2.13).
3. ``monitored_barrier`` refuses every group whose ``get_backend()`` is not "gloo"; groups with a cpu
   gloo backend, or a vccl backend (which implements it through its own Gloo), are accepted.
4. A tensor on a device the group has no backend for (a cpu tensor in a group created with backend "vccl", as
   with "nccl") fails in C++ with "No backend type associated with device type cpu", which does not say what
   to do. Every public c10d function reports its exceptions through ``c10d_logger._get_msg_dict``; the patch
   adds a note (PEP 678, shown with the traceback) to that error there, so the function objects Dynamo
   recognises stay torch's own.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from ..patches import replace

_installed = False


def _patch_backend_config() -> None:
    original = c10d.BackendConfig.__init__

    @functools.wraps(original)
    def __init__(self, backend):
        original(self, backend)
        mapping = self.device_backend_map
        if (
            str(backend) == c10d.Backend.UNDEFINED
            and set(mapping) == {"vnpu"}
            and mapping["vnpu"] == "vccl"
            and dist.is_gloo_available()
        ):
            self.device_backend_map = {"cpu": c10d.Backend("gloo"), "vnpu": mapping["vnpu"]}

    replace(c10d.BackendConfig, "__init__", __init__, "distributed.default-backend-config")


def _registered_types(pg) -> dict:
    from torch_vnpu.distributed import _bindings

    vccl_cls = _bindings().ProcessGroupVCCL
    types = {}
    for device in pg._device_types:
        try:
            backend = pg._get_backend(device)
        except RuntimeError:
            continue
        if isinstance(backend, c10d.ProcessGroupGloo):
            types["gloo"] = c10d.ProcessGroup.BackendType.GLOO
        elif isinstance(backend, vccl_cls):
            types["custom"] = c10d.ProcessGroup.BackendType.CUSTOM
    return types


def _patch_default_backend() -> None:
    original = c10d._new_process_group_helper

    @functools.wraps(original)
    def _new_process_group_helper(*args, **kwargs):
        pg, store = original(*args, **kwargs)
        if isinstance(pg, c10d.ProcessGroup):
            types = _registered_types(pg)
            if "custom" in types and pg._get_backend_name() not in types:
                pg._set_default_backend(types.get("gloo", types["custom"]))
        return pg, store

    replace(c10d, "_new_process_group_helper", _new_process_group_helper, "distributed.group-default-backend")


def _patch_monitored_barrier() -> None:
    original = c10d.monitored_barrier

    @functools.wraps(original)
    def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
        if c10d._rank_not_in_group(group) or c10d.get_backend(group) == c10d.Backend.GLOO:
            return original(group, timeout, wait_all_ranks)
        pg = group or c10d._get_default_group()
        devices = [d.type for d in pg._device_types]
        if "cpu" in devices and isinstance(pg._get_backend(torch.device("cpu")), c10d.ProcessGroupGloo):
            target = pg  # ProcessGroup.monitored_barrier runs on the cpu (gloo) backend
        elif "vnpu" in devices:
            target = pg._get_backend(torch.device("vnpu"))
        else:
            return original(group, timeout, wait_all_ranks)
        if timeout is None:
            timeout = c10d._get_default_timeout(c10d.get_backend(pg))
        c10d._check_valid_timeout(timeout)
        return target.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)

    replace(c10d, "monitored_barrier", monitored_barrier, "distributed.monitored-barrier")
    replace(dist, "monitored_barrier", monitored_barrier, "distributed.monitored-barrier")


_NO_BACKEND = "No backend type associated with device type "


def _no_backend_hint(message: str) -> str | None:
    if _NO_BACKEND not in message:
        return None
    rest = message.split(_NO_BACKEND, 1)[1].split()
    device = rest[0].strip(".") if rest else "?"
    if device == "cpu":
        return ("torch_vnpu: this process group has no backend for cpu tensors (a group created with backend "
                "'vccl' moves vnpu tensors only, as 'nccl' moves CUDA tensors only). Move the tensor to vnpu "
                "(tensor.to('vnpu')), or give the group a cpu backend too: init_process_group() / new_group() "
                "without a backend picks 'cpu:gloo,vnpu:vccl', or pass backend='cpu:gloo,vnpu:vccl'.")
    return (f"torch_vnpu: this process group has no backend for {device} tensors. Move the tensor to a device "
            f"the group serves (see its backend string, torch.distributed.get_backend(group)), or create the "
            f"group with a '{device}:<backend>' entry in its backend string.")


def _patch_no_backend_message() -> None:
    import sys

    from torch.distributed import c10d_logger

    original = c10d_logger._get_msg_dict

    @functools.wraps(original)
    def _get_msg_dict(*args, **kwargs):
        error = sys.exc_info()[1]
        if isinstance(error, RuntimeError) and not getattr(error, "__notes__", None):
            hint = _no_backend_hint(str(error))
            if hint is not None:
                error.add_note(hint)
        return original(*args, **kwargs)

    replace(c10d_logger, "_get_msg_dict", _get_msg_dict, "distributed.no-backend-hint")


def install() -> None:
    """Applies the patches once (torch 2.13 only; later versions carry the upstream fixes)."""
    global _installed
    if _installed:
        return
    _patch_backend_config()
    _patch_default_backend()
    _patch_monitored_barrier()
    _patch_no_backend_message()
    _installed = True
