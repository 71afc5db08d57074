"""``torch.vnpu.sanitizer``: VNPU_SANITIZE, checks that turn porting bugs into clear reports (issue #12).

On main today: check 5, hard-coded CUDA reached from a program running on vnpu (``torch.cuda.is_available()``,
``torch.cuda.is_bf16_supported()``, CUDA autocast and GradScaler, ``.cuda()``, string comparisons with
``"cuda"``), each call site reported once as a :class:`~torch_vnpu.sanitizer.cuda_calls.CudaCallWarning` with
the device-agnostic replacement (see :mod:`torch_vnpu.sanitizer.cuda_calls` and docs/sanitizer.md). The
runtime checks (stream races, use after free, unsynchronised host reads) are not merged yet (docs/STATUS.md).

Turn it on with the environment variable ``VNPU_SANITIZE=1`` (read when torch_vnpu loads, at ``import torch``)
or :func:`enable`. Off by default; off, nothing is wrapped.
"""

import os

from . import cuda_calls

__all__ = ["enable", "is_enabled"]


def enable() -> None:
    """Turns the sanitizer on for this process, as ``VNPU_SANITIZE=1`` does. Idempotent."""
    cuda_calls.install()


def is_enabled() -> bool:
    """True if the sanitizer is on (``VNPU_SANITIZE=1`` or :func:`enable`)."""
    return cuda_calls.installed()


def _enable_from_environment() -> None:
    if os.environ.get("VNPU_SANITIZE", "0").strip() not in ("", "0"):
        enable()
