// vnpu graphs: PyTorch's device-generic graph interface (at::GraphImplInterface,
// behind torch.accelerator.Graph and torch.vnpu.VNPUGraph), mirroring
// at::cuda::CUDAGraph.
//
// capture_begin() makes the current (non-default) stream capture: the work
// ops enqueue on it is recorded by the runtime (vnpuStreamBeginCapture)
// instead of run, and allocations on it come from the graph's private memory
// pool (Note [Graph memory pools], VNPUCachingAllocator.cpp). replay()
// enqueues the recorded sequence as one task on the current stream: the
// kernels run ATen's CPU kernels again on the same device addresses, so a
// replay sees the current contents of the captured inputs, as CUDA graphs do.
//
// Note [Random numbers in graphs]
// A random op enqueued eagerly takes (seed, offset) from its Generator at
// enqueue time and advances the offset. Captured, it instead records its
// offset within the graph and reads the graph's base (seed, offset) when it
// runs; each replay first enqueues a tiny task that sets the base from the
// generator's current state and advances the generator by everything the graph
// draws (CUDA's register_generator_state / replay_prologue). So every replay
// draws new numbers, and a replay from a given generator state draws exactly
// what eager execution from that state would have drawn.
//
// Threads: a graph object is used from one thread at a time (as CUDA's). The
// registry of capturing graphs (for the executor's random ops) is global and
// guarded by its own mutex.
#pragma once

#include "VNPUGeneratorImpl.h"

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>

namespace at::vnpu {

// The base a captured random op reads when it runs (written by each replay's prologue).
struct PhiloxBase {
  uint64_t seed = 0;
  uint64_t offset = 0;
};

// If the current stream of `device` is capturing into a vnpu graph: sets *base
// and *offset (this draw's offset within the graph, advancing the graph's
// count for `gen` by `increment` values, rounded as philox_engine_inputs
// does) and returns true; else false (one relaxed atomic load).
bool graph_philox_inputs(VNPUGeneratorImpl* gen, DeviceIndex device, uint64_t increment,
                         std::shared_ptr<PhiloxBase>* base, uint64_t* offset);

// A fresh id for a memory pool that graphs may share (torch.vnpu.graph_pool_handle()).
c10::MempoolId_t graph_pool_handle();

// True if the current stream of the current device is capturing (torch.vnpu.is_current_stream_capturing()).
bool is_current_stream_capturing();

// Registers the graph implementation for the vnpu device type (idempotent).
void register_graph_impl();

}  // namespace at::vnpu
