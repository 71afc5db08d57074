#include "Ipc.h"

#include "../core/VNPUException.h"
#include "../core/VNPUFunctions.h"

#include <c10/core/Storage.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Storage.h>

#include <vnpu/runtime.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace py = pybind11;

namespace torch_vnpu {
namespace {

// What a storage opened from a handle owns: its open of the exporter's memory
// and, when the sender counts receivers, its slot in the sender's reference
// slots (Note [Sent-tensor reference slots], src/torch_vnpu/_multiprocessing_reductions.py).
struct Received {
  void* ptr = nullptr;
  void* slots = nullptr;  // mapping of the page holding the slot, or null
  size_t slots_len = 0;
  int64_t* slot = nullptr;
};

// DataPtr deleter: drops this open (the last one unmaps the exporter's memory
// from this process) and tells the sender this receiver is done (slot = 0).
void release_received(void* ctx) {
  auto* r = static_cast<Received*>(ctx);
  (void)vnpuIpcCloseMemHandle(r->ptr);
  if (r->slot != nullptr) {
    __atomic_store_n(r->slot, int64_t{0}, __ATOMIC_RELEASE);
    munmap(r->slots, r->slots_len);
  }
  delete r;
}

// Maps the page of `path` (the sender's slot file, /proc/<pid>/fd/<fd>) that holds int64 slot `index`.
void map_slot(Received* r, const std::string& path, int64_t index) {
  const long page = sysconf(_SC_PAGESIZE);
  const off_t byte = static_cast<off_t>(index) * static_cast<off_t>(sizeof(int64_t));
  const off_t base = byte - byte % page;
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, "vnpu IPC: cannot open the sender's reference slots ", path, ": ", std::strerror(errno),
              " (the sending process is gone?)");
  void* m = mmap(nullptr, static_cast<size_t>(page), PROT_READ | PROT_WRITE, MAP_SHARED, fd, base);
  close(fd);
  TORCH_CHECK(m != MAP_FAILED, "vnpu IPC: cannot map the sender's reference slots: ", std::strerror(errno));
  r->slots = m;
  r->slots_len = static_cast<size_t>(page);
  r->slot = reinterpret_cast<int64_t*>(static_cast<char*>(m) + (byte - base));
}

}  // namespace

void bind_ipc(py::module& m) {
  // The handle of the device memory at `ptr` (a vnpu storage's base address), as vnpuIpcGetMemHandle.
  m.def("_ipc_mem_handle", [](uintptr_t ptr) {
    vnpuIpcMemHandle_t handle{};
    VNPU_CHECK(vnpuIpcGetMemHandle(&handle, reinterpret_cast<void*>(ptr)));
    return py::bytes(handle.reserved, sizeof(handle.reserved));
  });
  // A storage of `nbytes` on vnpu:<device> over the exporter's memory named by `handle`: writes on either side
  // are seen by the other. Opened with `device` current, so its addresses belong to that device here. With a
  // `slots_path`, the storage's death writes 0 into int64 slot `slot` of that file (the sender's count).
  m.def("_ipc_open_storage", [](const py::bytes& handle_bytes, size_t nbytes, c10::DeviceIndex device,
                                const std::string& slots_path, int64_t slot) {
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
    auto* received = new Received{ptr};
    if (!slots_path.empty()) {
      try {
        map_slot(received, slots_path, slot);
      } catch (...) {
        release_received(received);
        throw;
      }
    }
    c10::Storage storage(
        c10::Storage::use_byte_size_t(), nbytes,
        c10::DataPtr(ptr, received, &release_received, c10::Device(c10::DeviceType::PrivateUse1, device)),
        /*allocator=*/nullptr, /*resizable=*/false);
    PyObject* obj = THPStorage_Wrap(std::move(storage));
    if (obj == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(obj);
  });
}

}  // namespace torch_vnpu
