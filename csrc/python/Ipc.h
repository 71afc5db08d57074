// Inter-process sharing of vnpu storages, the native half of
// src/torch_vnpu/_multiprocessing_reductions.py (torch.multiprocessing with vnpu tensors).
#pragma once

#include <pybind11/pybind11.h>

namespace torch_vnpu {

// Adds _ipc_mem_handle(ptr) -> bytes and _ipc_open_storage(handle, nbytes,
// device, slots_path, slot) -> UntypedStorage to the module.
void bind_ipc(pybind11::module& m);

}  // namespace torch_vnpu
