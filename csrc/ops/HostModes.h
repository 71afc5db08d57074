// Global modes the user sets on the host that ATen's CPU kernels read while
// they run on a stream worker.
//
// Note [Host modes take effect as of the call]
// Most of at::Context's flags (deterministic algorithms and warn-only, float32
// matmul precision, the mkldnn/onednn switches, ...) are process-global: a
// kernel queued before the user changed one would read the new value when its
// stream reaches it. src/torch_vnpu/patches/host_modes.py therefore drains every vnpu
// stream before any such setter runs, so each kernel sees the value in force
// when it was called (a setter is rare; a per-kernel copy of the context is
// not possible, since the flags are global and the host reads them too).
// Flush-denormal is per thread (MXCSR): torch.set_flush_denormal sets it for
// the calling thread only, so the value is recorded here, after the same
// drain, and every worker applies it before its next task.
#pragma once

namespace at::vnpu {

// Records torch.set_flush_denormal's value for the stream workers.
void set_worker_flush_denormal(bool on);

// On a worker, before each task: the recorded flush-denormal mode (one relaxed
// load when it has not changed).
void apply_host_modes_on_worker();

}  // namespace at::vnpu
