// Sanitizer check 4: host access to device memory (runtime.h, "Sanitizer").
//
// Note [Protection keys]
// vnpu device memory is host memory, so host code that dereferences a device
// pointer (ctypes, numpy over a data_ptr(), a C extension) silently works
// here and crashes or reads garbage on a real accelerator. With the sanitizer
// on, every device memory mapping is tagged with one Linux memory protection
// key (pkey_mprotect). Access rights to a key are per thread (the PKRU
// register): threads start with keys 1-15 denied (the kernel's default PKRU)
// and new threads inherit their creator's rights. So:
//  * stream workers enable the key for good when they start (grant_worker);
//    the OpenMP helpers a worker creates for its kernels inherit that;
//  * every other thread is denied, except between
//    vnpuSanitizerDeviceAccessBegin/End (synchronous kernels on the calling
//    thread, transport threads). Threads created meanwhile keep the access:
//    the layer above releases the OpenMP pool it made in such a window;
//  * changing rights is WRPKRU, a user-mode instruction (no syscall, no TLB
//    flush), so it costs nothing next to a task; with the sanitizer off
//    nothing is tagged and no thread changes its rights.
// A denied access raises SIGSEGV with si_code SEGV_PKUERR and our key. The
// handler records the first such access (address, thread, read or write),
// re-tags that page with key 0 so the access completes when the handler
// returns, and counts pages. The report is taken at the next runtime call that
// checks (report_host_access), which re-tags all device memory. Nothing in the
// handler allocates or locks: it makes one syscall (pkey_mprotect) and writes
// atomics. Other faults go to the previous handler (Python's faulthandler,
// the default action) unchanged.
//
// Kernel accesses on behalf of a denied thread (write(2) from device memory)
// fail with EFAULT instead of faulting: they are not reported.
//
// Why at the next call, not at the faulting line: the handler interrupts
// arbitrary host code (numpy's inner loop, a C extension) where nothing can
// be raised; Python's asynchronous delivery (PyErr_SetInterruptEx) would take
// a signal number the program may use for itself and raise in the main thread
// at an arbitrary bytecode, whichever thread faulted. The next runtime call is
// where every other sanitizer error is raised too.
#include "internal.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace vnpu::rt::san {

std::atomic<int> g_pkey{-1};

namespace {

constexpr uintptr_t kPage = 4096;  // bytes re-tagged per fault

std::string g_reason;            // why check 4 is off although the sanitizer is on (set once, at setup)
std::once_flag g_handler_once;   // the SIGSEGV handler is installed once
struct sigaction g_prev_segv;    // the handler before ours, called for faults that are not ours
thread_local int t_depth = 0;    // DeviceAccessBegin nesting; a worker holds 1 for good

// The first host access since the last report. Written by the fault handler
// (g_state 0 -> 1 -> 2), read and reset by report_host_access.
std::atomic<int> g_state{0};
uintptr_t g_addr = 0;
int g_write = 0;
uint64_t g_tid = 0;
char g_tname[16] = {};
std::atomic<uint64_t> g_pages{0};  // pages re-tagged since the last report
std::mutex g_report_mu;            // one reporter at a time

void allow(bool on) {
  const int key = g_pkey.load(std::memory_order_relaxed);
  if (key >= 0) pkey_set(key, on ? 0 : PKEY_DISABLE_ACCESS);
}

int write_fault(void* uctx) {
#if defined(__x86_64__)
  // The page-fault error code: bit 1 set for a write.
  return (static_cast<ucontext_t*>(uctx)->uc_mcontext.gregs[REG_ERR] & 2) != 0 ? 1 : 0;
#else
  (void)uctx;
  return 0;
#endif
}

void chain(int sig, siginfo_t* si, void* uctx) {
  const struct sigaction& p = g_prev_segv;
  if (p.sa_flags & SA_SIGINFO) {
    if (p.sa_sigaction != nullptr) return p.sa_sigaction(sig, si, uctx);
  } else if (p.sa_handler != SIG_DFL && p.sa_handler != SIG_IGN) {
    return p.sa_handler(sig);
  }
  // Default action: restore it; the faulting instruction runs again and kills the process as before.
  signal(sig, SIG_DFL);
}

void on_segv(int sig, siginfo_t* si, void* uctx) {
  const int key = g_pkey.load(std::memory_order_relaxed);
#ifdef SEGV_PKUERR
  if (key >= 0 && si != nullptr && si->si_code == SEGV_PKUERR && static_cast<int>(si->si_pkey) == key) {
    const int saved_errno = errno;
    const auto a = reinterpret_cast<uintptr_t>(si->si_addr);
    if (pkey_mprotect(reinterpret_cast<void*>(a & ~(kPage - 1)), kPage, PROT_READ | PROT_WRITE, 0) == 0) {
      g_pages.fetch_add(1, std::memory_order_relaxed);
      int expected = 0;
      if (g_state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
        g_addr = a;
        g_write = write_fault(uctx);
        g_tid = static_cast<uint64_t>(syscall(SYS_gettid));
        std::memset(g_tname, 0, sizeof(g_tname));
        prctl(PR_GET_NAME, g_tname, 0, 0, 0);
        g_state.store(2, std::memory_order_release);
      }
      errno = saved_errno;
      return;  // the access runs again and succeeds
    }
    errno = saved_errno;
  }
#endif
  chain(sig, si, uctx);
}

void install_handler() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = &on_segv;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &g_prev_segv);
}

// Gives every page of device memory the key again (after a report).
void protect_all() {
  for (Device* d : devices()) {
    if (d->mem.base != nullptr && d->mem.capacity > 0) protect(d->mem.base, d->mem.capacity);
  }
  for_each_mapping([](void* p, size_t n) { protect(p, n); });
}

}  // namespace

void setup_host_check() {
  if (g_pkey.load() >= 0) return;
  int wanted = 1;
  vnpuGetEnvFlag("VNPU_SANITIZE_HOST_ACCESS", 1, &wanted);
  if (!wanted) return;
  // Denied for the calling thread; other threads are denied by the kernel's default rights.
  const int key = pkey_alloc(0, PKEY_DISABLE_ACCESS);
  if (key < 0) {
    g_reason = std::string("memory protection keys are unavailable (pkey_alloc: ") + std::strerror(errno) +
               "; they need an x86 CPU with PKU and Linux >= 4.9)";
    return;
  }
  g_pkey.store(key);
}

void protect(void* p, size_t n) {
  const int key = g_pkey.load(std::memory_order_relaxed);
  if (key >= 0 && n > 0) pkey_mprotect(p, n, PROT_READ | PROT_WRITE, key);
}

void protect_devices() {
  if (!host_check_on()) return;
  std::call_once(g_handler_once, install_handler);
  for (Device* d : devices()) {
    if (d->mem.base != nullptr && d->mem.capacity > 0) protect(d->mem.base, d->mem.capacity);
  }
}

void grant_worker() {
  if (!host_check_on()) return;
  t_depth = 1;  // never ends
  allow(true);
}

vnpuError_t report_host_access(vnpuStream_st* s, const char* name) {
  if (g_deferred_pending.load(std::memory_order_acquire)) {
    if (vnpuError_t e = take_deferred(s, name); e != vnpuSuccess) return e;
  }
  if (g_state.load(std::memory_order_acquire) != 2) return vnpuSuccess;
  std::lock_guard<std::mutex> g(g_report_mu);
  if (g_state.load(std::memory_order_acquire) != 2) return vnpuSuccess;
  vnpuSanitizerReport r;
  r.error = vnpuErrorHostAccess;
  r.ptr = reinterpret_cast<const void*>(g_addr);
  r.write = g_write;
  r.stream = s;
  r.name = name == nullptr ? "" : name;
  r.host_thread = g_tid;
  std::memcpy(r.host_thread_name, g_tname, sizeof(r.host_thread_name));
  r.host_thread_name[sizeof(r.host_thread_name) - 1] = '\0';
  r.host_pages = g_pages.exchange(0);
  // Reset before re-tagging: an access from now on is the next report's.
  g_state.store(0, std::memory_order_release);
  protect_all();
  set_report(std::move(r));
  return vnpuErrorHostAccess;
}

}  // namespace vnpu::rt::san

using namespace vnpu::rt;

int vnpuSanitizerHostAccessCheckEnabled(const char** reason) {
  devices();  // reads VNPU_SANITIZE
  if (reason != nullptr) *reason = san::on() && !san::host_check_on() ? san::g_reason.c_str() : "";
  return san::host_check_on() ? 1 : 0;
}

vnpuError_t vnpuSanitizerDeviceAccessBegin() {
  if (!san::host_check_on()) return vnpuSuccess;
  if (san::t_depth++ == 0) san::allow(true);
  return vnpuSuccess;
}

vnpuError_t vnpuSanitizerDeviceAccessEnd() {
  if (!san::host_check_on()) return vnpuSuccess;
  if (san::t_depth == 0) return vnpuErrorInvalidValue;  // no matching Begin
  if (--san::t_depth == 0) san::allow(false);
  return vnpuSuccess;
}

vnpuError_t vnpuSanitizerCheckHostAccess() {
  if (!san::on()) return vnpuSuccess;
  return san::report_host_access(nullptr, "vnpuSanitizerCheckHostAccess");
}
