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
* hard-coded CUDA reached from the program (``torch.cuda.is_bf16_supported()``, CUDA autocast and GradScaler,
  ``"cuda" in device``...), which silently switches features off on vnpu, is reported once per call site
  (:mod:`torch_vnpu.sanitizer.cuda_calls`, check 5).

Messages name the op, the tensor (shape, dtype, the op and Python stack that allocated it), both streams
and the fix. ``torch.cuda._sanitizer`` (CSAN, ``TORCH_CUDA_SANITIZER=1``) is the closest PyTorch
equivalent; it checks ATen calls only. See docs/sanitizer.md for what each check catches and cannot.

Turn it on with the environment variable ``VNPU_SANITIZE=1`` or :func:`enable` before the process uses a
vnpu device. It is off by default; off, it costs one relaxed atomic load per launch.
"""

import torch

from .. import _C
from . import cuda_calls

__all__ = ["StreamRaceError", "UseAfterFreeError", "enable", "is_enabled"]


class StreamRaceError(RuntimeError):
    """Two accesses to the same device memory from different streams (or a stream and the host) with no
    ordering between them, and at least one writes. Raised at the launching call; nothing was queued."""


class UseAfterFreeError(RuntimeError):
    """An access to device memory the caching allocator took back and has not handed out again."""


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
    cuda_calls.install()


def is_enabled() -> bool:
    """True if the sanitizer is on (``VNPU_SANITIZE=1`` or :func:`enable`)."""
    return bool(_C._sanitizer_is_enabled())


def _enable_from_environment() -> None:
    """At ``import torch`` with ``VNPU_SANITIZE=1``: the runtime read the variable itself; check 5 is Python."""
    cuda_calls.install()
