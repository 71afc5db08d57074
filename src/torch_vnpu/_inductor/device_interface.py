"""Dynamo's device interface for vnpu (``torch._dynamo.device_interface``).

Dynamo recognises ``torch.vnpu.Stream``/``Event`` objects and Inductor queries
device properties through this class, as it does ``torch.cuda`` through
``CudaInterface``. ``Worker`` answers from properties recorded in the parent
process, so compile workers never initialise the device (as CUDA's).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._dynamo.device_interface import DeviceInterface, caching_worker_current_devices, caching_worker_device_properties

from .. import vnpu
from .. import _C


class VnpuInterface(DeviceInterface):
    device = vnpu.device  # type: ignore[assignment]
    Event = vnpu.Event  # type: ignore[assignment]
    Stream = vnpu.Stream  # type: ignore[assignment]

    class Worker:
        @staticmethod
        def set_device(device: int) -> None:
            caching_worker_current_devices["vnpu"] = device  # not a patch: the interface's own cache, as CUDA's

        @staticmethod
        def current_device() -> int:
            if "vnpu" in caching_worker_current_devices:
                return caching_worker_current_devices["vnpu"]
            return vnpu.current_device()

        @staticmethod
        def get_device_properties(device: torch.types.Device = None) -> Any:
            if device is not None:
                if isinstance(device, str):
                    device = torch.device(device)
                if isinstance(device, torch.device):
                    if device.type != "vnpu":
                        raise ValueError(f"Expected a vnpu device, but got: {device}")
                    device = device.index
            if device is None:
                device = VnpuInterface.Worker.current_device()
            if "vnpu" not in caching_worker_device_properties:
                caching_worker_device_properties["vnpu"] = [  # not a patch: as CUDA's interface fills it
                    vnpu.get_device_properties(i) for i in range(vnpu.device_count())
                ]
            return caching_worker_device_properties["vnpu"][device]

    current_device = staticmethod(vnpu.current_device)
    set_device = staticmethod(vnpu.set_device)
    device_count = staticmethod(vnpu.device_count)
    is_available = staticmethod(vnpu.is_available)
    stream = staticmethod(vnpu.stream)  # type: ignore[assignment]
    current_stream = staticmethod(vnpu.current_stream)
    set_stream = staticmethod(vnpu.set_stream)  # type: ignore[assignment]
    synchronize = staticmethod(vnpu.synchronize)
    get_device_properties = staticmethod(vnpu.get_device_properties)  # type: ignore[assignment]
    memory_allocated = staticmethod(vnpu.memory_allocated)
    is_bf16_supported = staticmethod(vnpu.is_bf16_supported)  # type: ignore[assignment]

    @staticmethod
    def exchange_device(device: int) -> int:
        if device < 0:
            return -1
        return int(_C._exchange_device(device))

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        return VnpuInterface.exchange_device(device)

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        _C._set_stream(stream_id, device_index, device_type)

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        return vnpu.current_stream(device_idx).stream_id

    @staticmethod
    def get_compute_capability(device: torch.types.Device = None) -> int:
        major, minor = vnpu.get_device_capability(device)
        return major * 10 + minor

    @staticmethod
    def is_triton_capable(device: torch.types.Device = None) -> bool:
        return False


def register() -> None:
    """Registers :class:`VnpuInterface` for ``vnpu`` and ``vnpu:<i>`` (idempotent)."""
    from torch._dynamo.device_interface import register_interface_for_device

    register_interface_for_device("vnpu", VnpuInterface)
    for i in range(vnpu.device_count()):
        register_interface_for_device(f"vnpu:{i}", VnpuInterface)
