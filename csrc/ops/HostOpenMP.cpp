#include "HostOpenMP.h"

#include <vnpu/runtime.h>

#include <dlfcn.h>

namespace at::vnpu {
namespace {

// See Note [One OpenMP pool]. Resolved from the libgomp torch already loaded
// (RTLD_NOLOAD): linking our own OpenMP would load a second runtime.
using PauseFn = int (*)(int kind, int device_num);
using InitialDeviceFn = int (*)();

struct Gomp {
  PauseFn pause = nullptr;
  int host = 0;
  Gomp() {
    void* lib = dlopen("libgomp.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!lib) return;
    auto initial = reinterpret_cast<InitialDeviceFn>(dlsym(lib, "omp_get_initial_device"));
    pause = reinterpret_cast<PauseFn>(dlsym(lib, "omp_pause_resource"));
    if (!initial) pause = nullptr;
    if (pause) host = initial();
  }
};

constexpr int kOmpPauseSoft = 1;  // omp_pause_soft (OpenMP 5.0)
// Long enough that a training loop's host gap between steps (a sync, a
// loss.item()) keeps the pool; short next to CPU work worth speeding up.
constexpr unsigned kVNPUIdleReleaseMicros = 2000;

}  // namespace

void release_host_openmp_pool() {
  static const Gomp gomp;
  if (gomp.pause) gomp.pause(kOmpPauseSoft, gomp.host);
}

void release_openmp_pool_when_workers_idle() {
  vnpuSetWorkerIdleHook(&release_host_openmp_pool, kVNPUIdleReleaseMicros);
}

}  // namespace at::vnpu
