"""``torch.vnpu.sanitizer``: VNPU_SANITIZE, checks that turn timing-dependent porting bugs into errors.

With the sanitizer on, the vnpu runtime checks every memory access its streams execute (kernels, copies,
compiled kernels, synchronous kernels on the host) against a happens-before order built from CUDA's
semantics (same-stream order, events, ``wait_stream``, host synchronization), not from timing:

* a kernel or copy that reads memory another stream writes, or writes memory another stream reads or
  writes, with nothing ordering the two raises :class:`StreamRaceError` at the launching call (nothing is
  queued); a tensor freed while a side stream still used it without ``record_stream`` is caught when its
  memory is reused;
* freed device memory is poisoned in stream order (NaN for floating dtypes, 0xFF bytes otherwise) and an
  access to it before it is handed out again raises :class:`UseAfterFreeError`;
* device memory is inaccessible to host code (Linux memory protection keys): host code that dereferences a
  vnpu ``data_ptr()`` (ctypes, numpy over the pointer, a C extension) is recorded by a fault handler and
  raises :class:`HostAccessError` at the next vnpu call (check 4);
* hard-coded CUDA reached from the program (``torch.cuda.is_bf16_supported()``, CUDA autocast and GradScaler,
  ``"cuda" in device``...), which silently switches features off on vnpu, is reported once per call site
  (:mod:`torch_vnpu.sanitizer.cuda_calls`, check 5).

Messages name the op, the tensor (shape, dtype, the op and Python stack that allocated it), both streams
and the fix. ``torch.cuda._sanitizer`` (CSAN, ``TORCH_CUDA_SANITIZER=1``) is the closest PyTorch
equivalent; it checks ATen calls only. See docs/sanitizer.md for what each check catches and cannot.

Turn it on with the environment variable ``VNPU_SANITIZE=1`` or :func:`enable` before the process uses a
vnpu device. It is off by default; off, it costs one relaxed atomic load per launch.
"""

import atexit
import os
import sys
import warnings

import torch

from .. import _C
from . import cuda_calls

__all__ = ["HostAccessError", "StreamRaceError", "UseAfterFreeError", "enable", "is_enabled"]


class StreamRaceError(RuntimeError):
    """Two accesses to the same device memory from different streams (or a stream and the host) with no
    ordering between them, and at least one writes. Raised at the launching call; nothing was queued."""


class UseAfterFreeError(RuntimeError):
    """An access to device memory the caching allocator took back and has not handed out again."""


class HostAccessError(RuntimeError):
    """Host code read or wrote vnpu device memory directly (through a ``data_ptr()``: ctypes, numpy over the
    pointer, ``torch.from_blob`` on the CPU, a C extension), which crashes or reads garbage on a real
    accelerator. The access itself completed (vnpu memory is host memory); this is raised at the next vnpu
    call (an op, a copy, a synchronize) after it, on any thread. Its message names the address, the tensor
    memory (size, allocation site) and the thread. Needs memory protection keys (x86 PKU, Linux >= 4.9);
    ``VNPU_SANITIZE_HOST_ACCESS=0`` turns this check off."""


def _warn_if_host_access_check_off() -> None:
    on, why_not = _C._sanitizer_host_access_check()
    if not on and why_not:
        warnings.warn(
            f"VNPU_SANITIZE: check 4 (host access to device memory) is off: {why_not}. The other checks stay on.",
            RuntimeWarning,
            stacklevel=3,
        )


def enable() -> None:
    """Turns the sanitizer on for this process, as ``VNPU_SANITIZE=1`` does.

    Must run before the process's first vnpu work (allocation, kernel, copy): raises ``RuntimeError``
    once the device was initialized without it, since earlier work was not tracked. Idempotent.
    """
    if not _C._sanitizer_enable():
        raise RuntimeError(
            "torch.vnpu.sanitizer.enable() must be called before any vnpu work (the vnpu device is already "
            "initialized, and earlier work was not tracked). Set VNPU_SANITIZE=1 in the environment, or call "
            "torch.vnpu.sanitizer.enable() at the start of the program."
        )
    _install()


def is_enabled() -> bool:
    """True if the sanitizer is on (``VNPU_SANITIZE=1`` or :func:`enable`)."""
    return bool(_C._sanitizer_is_enabled())


def _enable_from_environment() -> None:
    """At ``import torch`` with ``VNPU_SANITIZE=1``: the runtime read the variable itself; check 5 is Python."""
    _install()


def _install() -> None:
    _warn_if_host_access_check_off()
    cuda_calls.install()
    atexit.unregister(_report_pending_at_exit)  # enable() may run more than once
    atexit.register(_report_pending_at_exit)


def _report_pending_at_exit() -> None:
    """At interpreter exit: an error kept for the next vnpu call (a host access to device memory, a free
    without ``record_stream``) is lost when the program makes no vnpu call after it. This asks the runtime
    for it without waiting for the streams (a stream still waiting for a peer must not hang the exit); if
    there is one, it prints the report to stderr and ends the process with exit status 1, as
    AddressSanitizer does with what it finds at exit. Skipped when the program ends with an uncaught sanitizer
    error (what follows it, such as the racing tensor's own free, is its consequence, and the process already
    failed); a sanitizer error the program caught and handled does not hide a later, independent one."""
    if not torch.vnpu.is_initialized():
        return
    uncaught = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)  # set for an unhandled error
    if isinstance(uncaught, (StreamRaceError, UseAfterFreeError, HostAccessError)):
        return
    try:
        _C._sanitizer_check_host_access(at_exit=True)
    except (StreamRaceError, UseAfterFreeError, HostAccessError) as e:
        sys.stdout.flush()
        print(
            "VNPU_SANITIZE: an error was found after the program's last vnpu call (reported at exit; the "
            f"process exits with status 1):\n{type(e).__name__}: {e}",
            file=sys.stderr,
        )
        sys.stderr.flush()
        os._exit(1)
