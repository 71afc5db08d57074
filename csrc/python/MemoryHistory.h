// Memory history and snapshots in CUDA's formats, the native half of
// torch.vnpu.memory._record_memory_history / _snapshot / _attach_out_of_memory_observer
// (mirrors torch/csrc/cuda/memory_snapshot.cpp). Stacks are PyTorch's own
// CapturedTraceback (torch/csrc/profiler/combined_traceback.h), symbolized with
// its py_symbolize, so frames have the keys _memory_viz reads.
#pragma once

#include <pybind11/pybind11.h>

namespace torch_vnpu {

// Adds _record_memory_history, _is_history_enabled, _memory_snapshot (segments only),
// _memory_snapshot_full (the dict of torch.cuda.memory._snapshot()) and
// _attach_out_of_memory_observer to the module.
void bind_memory_history(pybind11::module& m);

}  // namespace torch_vnpu
