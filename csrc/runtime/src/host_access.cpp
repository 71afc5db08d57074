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
// Note [Host access without protection keys]
// Where pkey_alloc fails (no PKU: most VMs, non-x86) or with
// VNPU_SANITIZE_HOST_ACCESS=mprotect, check 4 uses page protection instead
// ("fault and reopen"). Device memory is mprotect'ed PROT_NONE for every
// thread, so any access faults with SEGV_ACCERR inside a range we protected
// (g_ranges, a lock-free table the handler can read: the linear ranges and
// the vnpuMemMap mappings). The handler opens the memory and returns:
//  * an allowed thread opens a kChunk-aligned chunk and goes on. Allowed is a
//    blocked marker signal (g_mark_sig, SIGRTMAX) in the interrupted thread's
//    signal mask (uc_sigmask): grant_worker and DeviceAccessBegin block it,
//    End unblocks it, and new threads inherit their creator's mask, so
//    OpenMP helpers and transport threads get exactly the rights a PKRU
//    would give them;
//  * a denied thread opens one page and is recorded as with keys.
// Opened memory stays open for every thread until the host's next
// synchronization point (stream/event/device synchronize, a pageable
// device-to-host copy; host_waited) or report, which protect all device
// memory again; a worker still running then just faults again.
// The OS cannot fault and reopen: a system call on device memory (Gloo's
// socket transport sends and receives tensors in place) fails with EFAULT. Such
// callers open all device memory between vnpuSanitizerSystemAccessBegin/End,
// and protect_all leaves it open until the last End.
// What it cannot catch: a host access to a chunk an allowed thread opened
// since the last synchronization point (a host thread racing a kernel or a
// window on the same memory) or any access while a SystemAccess pair is open;
// other kernel-mode accesses (write(2) from device memory) fail with EFAULT for
// every thread, allowed ones included. Cost: a
// fault (a signal and an mprotect, a few microseconds) per chunk a kernel
// first touches after each synchronization point, and one mprotect over the
// device ranges (page-table walk and TLB shootdown) at each of them.
//
// Why at the next call, not at the faulting line: the handler interrupts
// arbitrary host code (numpy's inner loop, a C extension) where nothing can
// be raised; Python's asynchronous delivery (PyErr_SetInterruptEx) would take
// a signal number the program may use for itself and raise in the main thread
// at an arbitrary bytecode, whichever thread faulted. The next runtime call is
// where every other sanitizer error is raised too.
#include "internal.h"

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace vnpu::rt::san {

std::atomic<int> g_pkey{-1};
std::atomic<int> g_host_mode{kHostCheckOff};

namespace {

constexpr uintptr_t kPage = 4096;          // bytes re-tagged per denied fault
constexpr uintptr_t kChunk = 2048 * 1024;  // bytes opened per allowed fault (Note [Host access without protection keys])
constexpr int kMaxRanges = 4096;           // protected ranges the fallback handler knows

// Device memory ranges under the fallback, readable by the fault handler without locks. A slot is
// free when lo == 0; hi is stored after lo and cleared before it.
struct Range {
  std::atomic<uintptr_t> lo{0}, hi{0};
};
Range g_ranges[kMaxRanges];
std::atomic<int> g_nranges{0};  // slots in use are below this
int g_mark_sig = 0;             // blocked in allowed threads (fallback)

std::once_flag g_handler_once;   // the SIGSEGV handler is installed once
struct sigaction g_prev_segv;    // the handler before ours, called for faults that are not ours
thread_local int t_depth = 0;    // DeviceAccessBegin nesting; a worker holds 1 for good

// The first host access since the last report. Written by the fault handler
// (g_state 0 -> 1 -> 2), read and reset by report_host_access.
std::atomic<int> g_state{0};
uintptr_t g_addr = 0;
int g_write = 0;
uint64_t g_epoch = 0;  // allocations made before the access (g_alloc_epoch)
uint64_t g_tid = 0;
char g_tname[16] = {};
std::atomic<uint64_t> g_pages{0};  // pages re-tagged since the last report
std::mutex g_report_mu;            // one reporter at a time

void allow(bool on) {
  const int key = g_pkey.load(std::memory_order_relaxed);
  if (key >= 0) {
    pkey_set(key, on ? 0 : PKEY_DISABLE_ACCESS);
  } else if (g_host_mode.load(std::memory_order_relaxed) == kHostCheckMprotect) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, g_mark_sig);
    pthread_sigmask(on ? SIG_BLOCK : SIG_UNBLOCK, &set, nullptr);
  }
}

bool add_range(uintptr_t lo, uintptr_t hi) {
  for (int i = 0; i < kMaxRanges; ++i) {
    uintptr_t free_slot = 0;
    if (g_ranges[i].lo.compare_exchange_strong(free_slot, lo, std::memory_order_acq_rel)) {
      g_ranges[i].hi.store(hi, std::memory_order_release);
      int n = g_nranges.load(std::memory_order_relaxed);
      while (n < i + 1 && !g_nranges.compare_exchange_weak(n, i + 1, std::memory_order_acq_rel)) {
      }
      return true;
    }
  }
  return false;  // the table is full: the range stays unprotected
}

bool find_range(uintptr_t a, uintptr_t* lo, uintptr_t* hi) {
  const int n = g_nranges.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    const uintptr_t h = g_ranges[i].hi.load(std::memory_order_acquire);
    const uintptr_t l = g_ranges[i].lo.load(std::memory_order_acquire);
    if (l != 0 && l <= a && a < h) {
      *lo = l;
      *hi = h;
      return true;
    }
  }
  return false;
}

// Removes [lo, hi) (fallback): the ranges that start inside it.
void remove_ranges(uintptr_t lo, uintptr_t hi) {
  const int n = g_nranges.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    const uintptr_t l = g_ranges[i].lo.load(std::memory_order_acquire);
    if (l != 0 && lo <= l && l < hi) {
      g_ranges[i].hi.store(0, std::memory_order_release);
      g_ranges[i].lo.store(0, std::memory_order_release);
    }
  }
}

// Denies access to [p, p + n): the key, or no access at all (fallback).
void tag(void* p, size_t n) {
  if (n == 0) return;
  const int key = g_pkey.load(std::memory_order_relaxed);
  if (key >= 0) {
    pkey_mprotect(p, n, PROT_READ | PROT_WRITE, key);
  } else if (g_host_mode.load(std::memory_order_relaxed) == kHostCheckMprotect) {
    mprotect(p, n, PROT_NONE);
  }
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

// Records the first denied access since the last report (the fault handler's part).
void record(uintptr_t a, void* uctx) {
  g_pages.fetch_add(1, std::memory_order_relaxed);
  int expected = 0;
  if (g_state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    g_addr = a;
    g_write = write_fault(uctx);
    g_epoch = g_alloc_epoch.load(std::memory_order_relaxed);
    g_tid = static_cast<uint64_t>(syscall(SYS_gettid));
    std::memset(g_tname, 0, sizeof(g_tname));
    prctl(PR_GET_NAME, g_tname, 0, 0, 0);
    g_state.store(2, std::memory_order_release);
  }
}

// The fallback's part (Note [Host access without protection keys]): true if the fault was ours.
bool on_segv_mprotect(siginfo_t* si, void* uctx) {
  if (si == nullptr || si->si_code != SEGV_ACCERR || uctx == nullptr) return false;
  const auto a = reinterpret_cast<uintptr_t>(si->si_addr);
  uintptr_t lo = 0, hi = 0;
  if (!find_range(a, &lo, &hi)) return false;
  const bool allowed = sigismember(&static_cast<ucontext_t*>(uctx)->uc_sigmask, g_mark_sig) == 1;
  const uintptr_t size = allowed ? kChunk : kPage;
  const uintptr_t from = std::max(lo, a & ~(size - 1));
  const uintptr_t to = std::min(hi, (a & ~(size - 1)) + size);
  if (mprotect(reinterpret_cast<void*>(from), to - from, PROT_READ | PROT_WRITE) != 0) {
    // Out of memory maps (each open chunk splits the mapping): open the whole range instead.
    if (mprotect(reinterpret_cast<void*>(lo), hi - lo, PROT_READ | PROT_WRITE) != 0) return false;
  }
  if (!allowed) record(a, uctx);
  return true;
}

void on_segv(int sig, siginfo_t* si, void* uctx) {
  const int saved_errno = errno;
  if (g_host_mode.load(std::memory_order_relaxed) == kHostCheckMprotect) {
    const bool ours = on_segv_mprotect(si, uctx);
    errno = saved_errno;
    if (ours) return;  // the access runs again and succeeds
    return chain(sig, si, uctx);
  }
  const int key = g_pkey.load(std::memory_order_relaxed);
#ifdef SEGV_PKUERR
  if (key >= 0 && si != nullptr && si->si_code == SEGV_PKUERR && static_cast<int>(si->si_pkey) == key) {
    const auto a = reinterpret_cast<uintptr_t>(si->si_addr);
    if (pkey_mprotect(reinterpret_cast<void*>(a & ~(kPage - 1)), kPage, PROT_READ | PROT_WRITE, 0) == 0) {
      record(a, uctx);
      errno = saved_errno;
      return;  // the access runs again and succeeds
    }
  }
#endif
  errno = saved_errno;
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

std::mutex g_system_mu;    // orders protect_all with SystemAccessBegin (fallback)
int g_system_holds = 0;    // open SystemAccessBegin/End pairs; protect_all waits for none

// Gives every page of device memory the key again (after a report).
void protect_all() {
  std::unique_lock<std::mutex> hold(g_system_mu, std::defer_lock);
  if (g_pkey.load(std::memory_order_relaxed) < 0) {
    hold.lock();
    if (g_system_holds > 0) return;  // the memory stays open; the next host synchronization protects it
  }
  for (Device* d : devices()) {
    if (d->mem.base != nullptr && d->mem.capacity > 0) tag(d->mem.base, d->mem.capacity);
  }
  for_each_mapping([](void* p, size_t n) {
    uintptr_t lo = 0, hi = 0;  // the fallback protects only what its handler knows
    if (g_pkey.load(std::memory_order_relaxed) >= 0 || find_range(reinterpret_cast<uintptr_t>(p), &lo, &hi)) tag(p, n);
  });
}

}  // namespace

void setup_host_check() {
  if (host_check_on()) return;
  // VNPU_SANITIZE_HOST_ACCESS: 0 = off, 1 = on (keys, else the fallback), mprotect = the fallback.
  const char* env = std::getenv("VNPU_SANITIZE_HOST_ACCESS");
  const bool forced = env != nullptr && std::strcmp(env, "mprotect") == 0;
  if (!forced) {
    int wanted = 1;
    vnpuGetEnvFlag("VNPU_SANITIZE_HOST_ACCESS", 1, &wanted);
    if (!wanted) return;
    // Denied for the calling thread; other threads are denied by the kernel's default rights.
    const int key = pkey_alloc(0, PKEY_DISABLE_ACCESS);
    if (key >= 0) {
      g_pkey.store(key);
      g_host_mode.store(kHostCheckPkey);
      return;
    }
  }
  // Note [Host access without protection keys]
  g_mark_sig = SIGRTMAX;
  g_host_mode.store(kHostCheckMprotect);
}

void protect(void* p, size_t n) {
  if (n == 0) return;
  if (g_host_mode.load(std::memory_order_relaxed) == kHostCheckMprotect) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    if (!add_range(a, a + n)) return;
  }
  tag(p, n);
}

void unprotect(void* p, size_t n) {
  if (g_host_mode.load(std::memory_order_relaxed) != kHostCheckMprotect) return;
  const auto a = reinterpret_cast<uintptr_t>(p);
  remove_ranges(a, a + n);
}

void host_waited() {
  if (g_host_mode.load(std::memory_order_relaxed) == kHostCheckMprotect) protect_all();
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
  r.freed_since = allocated_since(g_addr, g_epoch) ? 1 : 0;
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
  if (reason != nullptr) *reason = "";  // off only when asked (VNPU_SANITIZE_HOST_ACCESS=0)
  return san::g_host_mode.load(std::memory_order_relaxed);
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

vnpuError_t vnpuSanitizerSystemAccessBegin() {
  if (san::g_host_mode.load(std::memory_order_relaxed) != san::kHostCheckMprotect) return vnpuSuccess;
  std::lock_guard<std::mutex> g(san::g_system_mu);
  if (san::g_system_holds++ == 0) {
    const int n = san::g_nranges.load(std::memory_order_acquire);
    for (int i = 0; i < n; ++i) {
      const uintptr_t hi = san::g_ranges[i].hi.load(std::memory_order_acquire);
      const uintptr_t lo = san::g_ranges[i].lo.load(std::memory_order_acquire);
      if (lo != 0 && hi > lo) mprotect(reinterpret_cast<void*>(lo), hi - lo, PROT_READ | PROT_WRITE);
    }
  }
  return vnpuSuccess;
}

vnpuError_t vnpuSanitizerSystemAccessEnd() {
  if (san::g_host_mode.load(std::memory_order_relaxed) != san::kHostCheckMprotect) return vnpuSuccess;
  std::lock_guard<std::mutex> g(san::g_system_mu);
  if (san::g_system_holds == 0) return vnpuErrorInvalidValue;  // no matching Begin
  --san::g_system_holds;
  return vnpuSuccess;
}

vnpuError_t vnpuSanitizerCheckHostAccess() {
  if (!san::on()) return vnpuSuccess;
  return san::report_host_access(nullptr, "vnpuSanitizerCheckHostAccess");
}
