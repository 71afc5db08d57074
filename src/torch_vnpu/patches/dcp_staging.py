"""torch.distributed.checkpoint's staging waits for the copies of tensors on every vnpu device, not only the
current one.

DCP's ``_OverlappingCpuLoader`` (what ``dcp.save`` stages through on an accelerator) copies each tensor to the
host with ``non_blocking=True`` and then synchronizes one stream of the current device. A tensor on another
device (a model on ``vnpu:1`` saved while ``vnpu:0`` is current) is copied on its own device's stream, which
nobody waits for: the checkpoint got whatever the host buffer held (stale values; NaN under the sanitizer), with
no error. The same holds for CUDA. Once ``torch.distributed.checkpoint.filesystem`` is imported, the loader
remembers the vnpu devices of the tensors it staged and synchronizes their current streams where it
synchronizes its own.
"""

from __future__ import annotations

import functools

from . import replace

_MODULE = "torch.distributed.checkpoint.filesystem"


def _sync_other_devices(loader) -> None:
    import torch

    own = getattr(loader.stream, "device_index", None)
    for index in getattr(loader, "_vnpu_devices", ()):
        if index != own:
            torch.vnpu.current_stream(index).synchronize()


def _patch(module) -> None:
    cls = module._OverlappingCpuLoader
    if getattr(cls.__init__, "_vnpu_staging", False):
        return
    init, drain, finish = cls.__init__, cls._drain, cls._finish

    @functools.wraps(init)
    def __init__(self, resolve_fun, *args, **kwargs):
        devices: set[int] = set()

        def resolve(obj):
            tensor = resolve_fun(obj)
            if getattr(tensor, "device", None) is not None and tensor.device.type == "vnpu":
                devices.add(tensor.device.index)
            return tensor

        init(self, resolve, *args, **kwargs)
        self._vnpu_devices = devices

    @functools.wraps(drain)
    def _drain(self):
        if self.in_flight_data >= self.inflight_threshhold:
            _sync_other_devices(self)
        return drain(self)

    @functools.wraps(finish)
    def _finish(self):
        if len(self.current_items) > 0:
            _sync_other_devices(self)
        return finish(self)

    __init__._vnpu_staging = True
    replace(cls, "__init__", __init__, "distributed-checkpoint.staging-every-device")
    replace(cls, "_drain", _drain, "distributed-checkpoint.staging-every-device")
    replace(cls, "_finish", _finish, "distributed-checkpoint.staging-every-device")


def install() -> None:
    from .._import_hooks import when_imported

    when_imported(_MODULE, _patch)
