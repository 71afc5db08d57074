#include "Ipc.h"

#include "../core/VNPUException.h"
#include "../core/VNPUFunctions.h"

#include <c10/core/Storage.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Storage.h>

#include <vnpu/runtime.h>

#include <cstring>
#include <string>

namespace py = pybind11;

namespace torch_vnpu {
namespace {

// DataPtr deleter of a storage opened from a handle: drops this open (the last
// one unmaps the exporter's memory from this process).
void close_handle(void* ptr) { (void)vnpuIpcCloseMemHandle(ptr); }

}  // namespace

void bind_ipc(py::module& m) {
  // The handle of the device memory at `ptr` (a vnpu storage's base address), as vnpuIpcGetMemHandle.
  m.def("_ipc_mem_handle", [](uintptr_t ptr) {
    vnpuIpcMemHandle_t handle{};
    VNPU_CHECK(vnpuIpcGetMemHandle(&handle, reinterpret_cast<void*>(ptr)));
    return py::bytes(handle.reserved, sizeof(handle.reserved));
  });
  // A storage of `nbytes` on vnpu:<device> over the exporter's memory named by `handle`: writes on either side
  // are seen by the other. Opened with `device` current, so its addresses belong to that device here.
  m.def("_ipc_open_storage", [](const py::bytes& handle_bytes, size_t nbytes, c10::DeviceIndex device) {
    std::string raw = handle_bytes;
    TORCH_CHECK_VALUE(raw.size() == sizeof(vnpuIpcMemHandle_t::reserved), "vnpu IPC handle of ", raw.size(),
                      " bytes, expected ", sizeof(vnpuIpcMemHandle_t::reserved));
    vnpuIpcMemHandle_t handle{};
    std::memcpy(handle.reserved, raw.data(), raw.size());
    void* ptr = nullptr;
    {
      c10::vnpu::check_device_index(device);
      const c10::DeviceIndex prev = c10::vnpu::ExchangeDevice(device);
      const vnpuError_t err = vnpuIpcOpenMemHandle(&ptr, handle, vnpuIpcMemLazyEnablePeerAccess);
      c10::vnpu::ExchangeDevice(prev);
      VNPU_CHECK(err);
    }
    c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes,
                         c10::DataPtr(ptr, ptr, &close_handle, c10::Device(c10::DeviceType::PrivateUse1, device)),
                         /*allocator=*/nullptr, /*resizable=*/false);
    PyObject* obj = THPStorage_Wrap(std::move(storage));
    if (obj == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(obj);
  });
}

}  // namespace torch_vnpu
