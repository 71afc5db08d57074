"""What Inductor's generated Python and C++ wrappers write for vnpu device operations."""

from __future__ import annotations

from textwrap import dedent

from torch._inductor.codegen.common import DeviceOpOverrides


class VnpuDeviceOpOverrides(DeviceOpOverrides):
    """Device guard, device selection and synchronisation through ``torch.vnpu`` (as CUDA's use ``torch.cuda``).

    The raw stream of a vnpu device is the id of its current ``torch.vnpu.Stream``
    (fused kernels find their stream themselves, see :mod:`.kernel_launch`).
    """

    def import_get_raw_stream_as(self, name: str) -> str:
        return dedent(
            f"""
            def {name}(index):
                return torch.vnpu.current_stream(index).stream_id
            """
        )

    def set_device(self, device_idx: int) -> str:
        return f"torch.vnpu.set_device({device_idx})"

    def synchronize(self) -> str:
        return "torch.vnpu.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"torch.vnpu.device({device_idx})"

    def current_stream(self) -> str:
        return "torch.vnpu.current_stream()"

    def cpp_kernel_type(self) -> str:
        return "void*"

    def cpp_device_guard(self) -> str:
        # C++ wrapper (cpp_wrapper.py): a c10::DeviceGuard on the graph's vnpu device.
        return "torch_vnpu_cpp_wrapper::DeviceGuard"

    def cpp_aoti_device_guard(self) -> str:
        return "torch_vnpu_cpp_wrapper::DeviceGuard"

    def cpp_aoti_stream_guard(self) -> str:
        # AOTInductor's run_impl: the device the package was loaded for, on its current stream (cpp_wrapper.py).
        return "torch_vnpu_cpp_wrapper::AotiStreamGuard"
