// Note [Interrupting host waits]
// torch.vnpu.synchronize(), Stream/Event.synchronize(), .item(), .cpu() and the
// data-dependent ops block the calling thread until queued device work is done,
// with the GIL released. Python runs signal handlers only between bytecodes of
// the main thread, so a Ctrl-C during such a wait used to surface when the
// whole queue had drained (CUDA behaves so too). Here the runtime cuts a
// blocking wait into slices (vnpuSetWaitInterruptHook) and calls
// `poll_signals` between them. On the main thread it takes the GIL and runs
// PyErr_CheckSignals(): if a handler raised (KeyboardInterrupt from the
// default SIGINT handler, or anything a user handler raises) the exception is
// kept and the runtime ends the wait with vnpuErrorInterrupted; VNPU_CHECK then
// calls `raise_pending`, which throws it as torch's python_error, so torch's
// bindings re-raise that very Python exception. A handler that returns
// normally lets the wait go on. The queued work is untouched (it finishes on
// its stream; a copy into host memory its caller gives up is abandoned), so
// the device stays consistent and the next synchronization waits for it.
// Other threads never poll: Python would not run handlers there. Nor do waits
// under c10::vnpu::NoInterruptGuard (taken where a lock is held that a thread
// holding the GIL may wait for: taking the GIL there could deadlock).
#include "Interrupts.h"

#include "../core/VNPUException.h"

#include <Python.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Exceptions.h>

#include <vnpu/runtime.h>

#include <atomic>

namespace torch_vnpu {
namespace {

constexpr unsigned kSliceUs = 20000;  // how long a signal may wait to be noticed (20 ms)

std::atomic<unsigned long> g_main_thread{0};  // PyThread ident of Python's main thread

// The exception a signal handler raised during this thread's wait, until raised.
thread_local PyObject* t_type = nullptr;
thread_local PyObject* t_value = nullptr;
thread_local PyObject* t_traceback = nullptr;

int poll_signals() {
  if (PyThread_get_thread_ident() != g_main_thread.load() || !c10::vnpu::interrupts_allowed()) return 0;
  if (t_type != nullptr) return 1;  // an earlier interrupt that nobody raised yet
  if (!Py_IsInitialized() || _Py_IsFinalizing()) return 0;
  PyGILState_STATE st = PyGILState_Ensure();
  int stop = 0;
  if (!PyErr_Occurred() && PyErr_CheckSignals() != 0) {
    PyErr_Fetch(&t_type, &t_value, &t_traceback);
    stop = t_type != nullptr;
  }
  PyGILState_Release(st);
  return stop;
}

[[noreturn]] void raise_pending() {
  pybind11::gil_scoped_acquire gil;
  if (t_type != nullptr) {
    PyErr_Restore(t_type, t_value, t_traceback);  // steals the references
    t_type = t_value = t_traceback = nullptr;
  } else {
    PyErr_SetNone(PyExc_KeyboardInterrupt);  // the hook said stop but kept nothing: still an interrupt
  }
  python_error e;
  e.persist();
  throw e;
}

// Note [Waits release the GIL]
// A kernel written in Python (a torch.library op registered for the CPU, run
// on vnpu tensors) runs on the stream's worker and takes the GIL there. A host
// wait reached from C++ code that holds the GIL (torch's Python indexing with
// a 0-dim index tensor calls item() so) then waited for a kernel that waited
// for the GIL: a deadlock. Interruptible waits release the GIL when the
// waiting thread holds it, as the Python bindings of synchronize() do. Not
// under NoInterruptGuard: a thread holding the GIL may wait for the lock held
// there, and retaking the GIL afterwards could then deadlock.
void* release_gil() {
  if (!c10::vnpu::interrupts_allowed() || !Py_IsInitialized() || _Py_IsFinalizing() || !PyGILState_Check())
    return nullptr;
  return PyEval_SaveThread();
}

void restore_gil(void* state) {
  if (state != nullptr) PyEval_RestoreThread(static_cast<PyThreadState*>(state));
}

}  // namespace

void install_interrupt_handling() {
  pybind11::object threading = pybind11::module_::import("threading");
  g_main_thread.store(threading.attr("main_thread")().attr("ident").cast<unsigned long>());
  c10::vnpu::set_interrupt_raiser(&raise_pending);
  vnpuSetWaitInterruptHook(&poll_signals, kSliceUs);
  vnpuSetBlockingWaitHooks(&release_gil, &restore_gil);
}

}  // namespace torch_vnpu
