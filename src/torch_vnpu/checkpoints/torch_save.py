"""``torch.save`` of vnpu tensors with the storages downloaded ahead into pinned buffers.

torch.save pickles the object, then writes each storage in turn, calling ``storage.cpu()`` on a device storage
just before writing it: one blocking copy into fresh host memory per storage, so the device sits idle while the
file is written and the host pays first-touch faults for every byte. Here, inside torch.save, the first
``.cpu()`` of a vnpu storage takes torch's list of the storages still to write and queues their downloads into
pinned buffers, up to ``WINDOW_BYTES`` ahead, on each storage's current stream; each ``.cpu()`` then waits for
its own download only and queues the next ones, so downloads overlap the writes. A storage larger than the
window keeps torch's copy (its sync costs little against its size, and no pinned buffer that large stays cached
in the host allocator). The bytes are those of the
call's place in stream order, as with torch's copy. The file is torch.save's own (same records, same bytes).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

__all__ = ["WINDOW_BYTES", "saving", "take"]

WINDOW_BYTES = 64 << 20

_tls = threading.local()


def _key(storage: Any) -> tuple:
    return storage.device.index, storage.data_ptr(), storage.nbytes()


class _Downloads:
    """The downloads of one torch.save, in the order it writes the storages."""

    def __init__(self, storages: list) -> None:
        # A storage larger than the window keeps torch's copy: its pinned buffer would stay cached afterwards.
        self.order = [s for s in storages if s.device.type == "vnpu" and 0 < s.nbytes() <= WINDOW_BYTES]
        self.next = 0  # index in order of the next download to queue
        self.ready: dict[tuple, tuple[torch.Tensor, torch.vnpu.Event]] = {}
        self.queued_bytes = 0

    def fill(self) -> None:
        while self.next < len(self.order) and (not self.ready or self.queued_bytes < WINDOW_BYTES):
            storage = self.order[self.next]
            self.next += 1
            key = _key(storage)
            if key in self.ready:
                continue
            n = storage.nbytes()
            with torch.vnpu.device(storage.device):
                source = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, 0, (n,), (1,))
                buffer = torch.empty(n, dtype=torch.uint8, pin_memory=True)
                buffer.copy_(source, non_blocking=True)
                done = torch.vnpu.Event()
                done.record()
            self.ready[key] = (buffer, done)
            self.queued_bytes += n

    def take(self, storage: Any) -> torch.UntypedStorage | None:
        got = self.ready.pop(_key(storage), None)
        if got is None:
            return None
        buffer, done = got
        self.queued_bytes -= buffer.numel()
        done.synchronize()
        self.fill()
        return buffer.untyped_storage()


class saving:
    """Context of one torch.save call on this thread (the downloads it queued are dropped at its end)."""

    def __enter__(self) -> "saving":
        stack = getattr(_tls, "stack", None)
        if stack is None:
            stack = _tls.stack = []
        stack.append(None)
        return self

    def __exit__(self, *exc: object) -> None:
        _tls.stack.pop()


def take(storage: Any, serialized_storages: dict) -> torch.UntypedStorage | None:
    """A CPU storage (pinned) holding ``storage``'s bytes, from the downloads of the current torch.save, or None
    when no torch.save runs on this thread or the storage's stream is capturing a graph (torch's copy then raises
    the capture error, as on CUDA).

    Args:
        storage: a vnpu ``UntypedStorage`` torch.save is about to write.
        serialized_storages: torch.save's dict of the storages it writes, in order (read at the first call).
    """
    stack = getattr(_tls, "stack", None)
    if not stack:
        return None
    with torch.vnpu.device(storage.device):
        if torch.vnpu.is_current_stream_capturing():  # torch's copy raises CUDA's error for a host read
            return None
    if stack[-1] is None:
        stack[-1] = _Downloads(list(serialized_storages.values()))
        stack[-1].fill()
    return stack[-1].take(storage)
