// Keeps one OpenMP thread pool busy per process: the stream worker's.
//
// Note [One OpenMP pool]
// ATen's CPU kernels parallelise with OpenMP (libgomp in the torch wheel).
// libgomp gives every thread that starts a parallel region its own pool of
// helper threads, and once the pools together hold more threads than there
// are CPUs it stops spinning between regions and parks helpers on a futex.
// On vnpu the kernels run on a stream worker, so the host thread's pool
// (made by any CPU op it ran earlier: model init, data prep) sits idle but
// still counts, and every parallel region on the worker pays a wake-up:
// a 64x64 matmul took 130-180 us on the worker vs 10 us on the main thread
// (2 CPUs). Releasing the calling thread's idle pool with OpenMP 5.0's
// omp_pause_resource before each launch leaves the worker's pool the only
// one (the same matmul: 8 us). Thread counts do not change, so kernels
// split work exactly as on CPU and results stay bitwise equal. The host
// thread's next parallel CPU op simply recreates its pool. The other way
// round, a stream worker idle for 2 ms releases its own
// pool, so CPU work between bursts of device work runs at full speed.
#pragma once

namespace at::vnpu {

// Releases the calling thread's idle OpenMP pool (no-op inside a parallel
// region, when the thread has no pool, or when the OpenMP runtime is not
// libgomp). Cheap enough to call on every launch.
void release_host_openmp_pool();

// Installs release_host_openmp_pool as the runtime's worker idle hook.
void release_openmp_pool_when_workers_idle();

}  // namespace at::vnpu
