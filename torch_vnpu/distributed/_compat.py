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
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

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

    c10d.BackendConfig.__init__ = __init__


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

    c10d._new_process_group_helper = _new_process_group_helper


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

    c10d.monitored_barrier = monitored_barrier
    dist.monitored_barrier = monitored_barrier


def install() -> None:
    """Applies the patches once (torch 2.13 only; later versions carry the upstream fixes)."""
    global _installed
    if _installed:
        return
    _patch_backend_config()
    _patch_default_backend()
    _patch_monitored_barrier()
    _installed = True
