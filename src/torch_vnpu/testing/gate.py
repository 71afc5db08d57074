"""A stream gate for tests of asynchronous behaviour: ``with Gate() as g: g.block(stream)`` stalls ``stream``
until the ``with`` block exits (or ``g.open()``), so work queued behind it is certainly still pending when a
test inspects it, without relying on timing (``torch.cuda._sleep`` plays this part in CUDA's tests).

The gate is a CPU custom op, so on vnpu it runs on the stream's worker like every ATen kernel. A gate never
opened raises on the stream after ``TIMEOUT_S`` (a sticky error at the next synchronization) instead of hanging.
"""

from __future__ import annotations

import threading

import torch

__all__ = ["Gate", "TIMEOUT_S", "open_all"]

TIMEOUT_S = 20
_OPEN = threading.Event()


@torch.library.custom_op("vnpu_testing::gate", mutates_args=(), device_types="cpu")
def _gate(x: torch.Tensor) -> torch.Tensor:
    if not _OPEN.wait(TIMEOUT_S):
        raise RuntimeError("vnpu_testing::gate was never opened")
    return x.clone()


@_gate.register_fake
def _(x):
    return torch.empty_like(x)


def open_all() -> None:
    """Open every gate (e.g. in a fixture's teardown, so a failed test cannot leave a stream stalled)."""
    _OPEN.set()


class Gate:
    """Context manager; :meth:`block` queues the gate on a vnpu stream (default: the current one)."""

    def __enter__(self) -> "Gate":
        _OPEN.clear()
        return self

    def block(self, stream: torch.vnpu.Stream | None = None) -> None:
        stream = stream or torch.vnpu.current_stream()
        with torch.vnpu.stream(stream):
            _gate(torch.zeros(1, device=f"vnpu:{stream.device_index}"))

    def open(self) -> None:
        _OPEN.set()

    def __exit__(self, *exc) -> bool:
        _OPEN.set()
        return False
