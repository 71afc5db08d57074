"""torch.multiprocessing with vnpu tensors: a vnpu tensor (or storage, or ``nn.Parameter``) sent through a
``torch.multiprocessing`` queue or pipe arrives in the other process as a vnpu tensor over the *same* device
memory, as CUDA tensors do (CUDA IPC; torch/multiprocessing/reductions.py).

How: the sender pickles the runtime's IPC handle of the storage (``vnpuIpcGetMemHandle``: device memory is a
memfd mapping, Note [Shareable device memory] in csrc/runtime/src/ipc.cpp); the receiver maps the sender's
device memory with ``vnpuIpcOpenMemHandle`` (once per sender device, shared by all tensors from it) and wraps
the storage's range in a storage on ``vnpu:<the sender's device index>``, which must exist in the receiver.
Views of one storage received in the same process share one storage again (torch's ``shared_cache``).

Semantics and rules, those of CUDA tensors in torch.multiprocessing:
- Writes in either process are seen by the other (synchronize the stream that wrote before reading elsewhere).
- Memory stays allocated in the sender until every receiver has released it, even if the sender drops its
  tensor first (Note [Sent-tensor reference slots]); it is freed at the sender's next send or
  ``torch.vnpu.ipc_collect()`` after the last release (CUDA: ``torch.cuda.ipc_collect``). A message that is
  never received, or a receiver that dies without releasing, keeps it until the sender exits (as CUDA).
- Work queued on the sender's device when the tensor is pickled is finished first (the sender waits for the
  device; CUDA records an event the receiver waits on), so the receiver sees the values at the time of sending.
- Processes must be started with ``spawn`` or ``forkserver``: a process forked after vnpu was initialized
  cannot use vnpu (as with CUDA).
Errors: ``RuntimeError`` from the runtime when device memory cannot be exported (``VNPU_IPC=0``; expandable
segments, whose memory is not one shareable range) or the sender is gone before the receiver maps it.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading

import torch

__all__ = ["ipc_collect"]

# Note [Sent-tensor reference slots]
# CUDA's torch.multiprocessing keeps a sent block alive in the sender until the receivers' reference counters
# (a shared file) drop to zero. Here: the sender owns a memfd of int64 slots; each sent storage takes a slot
# set to 1, and the sender holds the storage until the slot reads 0 again. The receiver maps the slot's page
# (by /proc/<sender pid>/fd/<fd>, as the runtime maps device memory) and its storage's deleter writes 0
# (csrc/python/Ipc.cpp); a receiver that already holds the storage (views sent again) writes 0 at once. Only
# the low byte changes (1 -> 0), so the sender's unlocked reads cannot see a torn value.
_SLOT = struct.Struct("q")


class _SentSlots:
    def __init__(self) -> None:
        self._lock = threading.Lock()  # queues pickle on feeder threads
        self._fd = -1
        self._map: mmap.mmap | None = None
        self._size = 0  # slots
        self._free: list[int] = []
        self._held: list[tuple[int, torch.UntypedStorage]] = []  # (slot, storage) until the slot reads 0

    def take(self, storage: torch.UntypedStorage) -> tuple[str, int]:
        """A slot set to 1 for one message carrying ``storage``: (path receivers open, slot index)."""
        with self._lock:
            self._collect_locked()
            if not self._free:
                self._grow_locked()
            slot = self._free.pop()
            _SLOT.pack_into(self._map, slot * _SLOT.size, 1)
            self._held.append((slot, storage))
            return f"/proc/{os.getpid()}/fd/{self._fd}", slot

    def collect(self) -> int:
        with self._lock:
            return self._collect_locked()

    def _collect_locked(self) -> int:
        done = [i for i, (slot, _) in enumerate(self._held) if _SLOT.unpack_from(self._map, slot * _SLOT.size)[0] == 0]
        for i in reversed(done):
            slot, _ = self._held.pop(i)
            self._free.append(slot)
        return len(done)

    def _grow_locked(self) -> None:
        size = max(4096, 2 * self._size)
        if self._fd < 0:
            self._fd = os.memfd_create("vnpu-ipc-ref-slots", os.MFD_CLOEXEC)
        os.ftruncate(self._fd, size * _SLOT.size)  # receivers' mappings of the first pages stay valid
        if self._map is not None:
            self._map.close()
        self._map = mmap.mmap(self._fd, size * _SLOT.size)
        self._free.extend(range(size - 1, self._size - 1, -1))
        self._size = size


_sent = _SentSlots()


def ipc_collect() -> int:
    """Frees what this process sent to other processes once every receiver has released it (also done at each
    send), as ``torch.cuda.ipc_collect``. Returns the number of sent storages released since the last collect."""
    return _sent.collect()


def _release_slot(path: str, slot: int) -> None:
    """Tells the sender that this receiver does not keep the storage of that message (it already has it)."""
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        os.pwrite(fd, _SLOT.pack(0), slot * _SLOT.size)
    finally:
        os.close(fd)

_BACKEND = "vnpu"


def _handle(storage: torch.UntypedStorage) -> bytes:
    from . import _C

    device = storage.device.index
    torch.vnpu.synchronize(device)  # the receiver sees the values as of now (no inter-process events)
    try:
        return _C._ipc_mem_handle(storage.data_ptr())
    except RuntimeError as e:
        raise RuntimeError(
            f"cannot share a vnpu:{device} tensor with another process: its device memory cannot be exported "
            "(VNPU_IPC=0 makes device memory private; with expandable segments, PYTORCH_ALLOC_CONF="
            "expandable_segments:True, memory is not one shareable range). Send a CPU copy (tensor.cpu()) "
            f"instead, or run without those settings. Runtime error: {e}"
        ) from e


def _open(handle: bytes, nbytes: int, device: int, slots_path: str, slot: int) -> torch.UntypedStorage:
    """The storage named by ``handle``, shared with views already received in this process."""
    from torch.multiprocessing.reductions import StorageWeakRef, shared_cache, storage_from_cache

    from . import _C

    key = (_BACKEND, handle, nbytes)
    storage = storage_from_cache(torch.UntypedStorage, key)
    if storage is not None:  # already here (or sent within this process): this message holds nothing
        _release_slot(slots_path, slot)
        return storage
    storage = _C._ipc_open_storage(handle, nbytes, device, slots_path, slot)
    shared_cache[key] = StorageWeakRef(storage)  # not a patch: torch's cache, filled as its reducers do
    return storage


def _rebuild_storage(handle: bytes, nbytes: int, device: int, slots_path: str, slot: int) -> torch.UntypedStorage:
    if nbytes == 0:
        return torch.UntypedStorage(0, device=torch.device(_BACKEND, device))
    return _open(handle, nbytes, device, slots_path, slot)


def _rebuild_tensor(cls, size, stride, offset, dtype, requires_grad, handle, nbytes, device, slots_path, slot):
    storage = _rebuild_storage(handle, nbytes, device, slots_path, slot)
    t = torch._utils._rebuild_tensor(
        torch.storage.TypedStorage(wrap_storage=storage, dtype=dtype, _internal=True), offset, size, stride
    )
    if cls is torch.nn.parameter.Parameter:
        return torch.nn.parameter.Parameter(t, requires_grad=requires_grad)  # integer tensors need it here
    t.requires_grad = requires_grad
    return t


def _storage_args(storage: torch.UntypedStorage) -> tuple:
    from torch.multiprocessing.reductions import StorageWeakRef, shared_cache

    nbytes = storage.nbytes()
    if nbytes == 0:
        return (b"", 0, storage.device.index, "", -1)
    handle = _handle(storage)
    # not a patch: a same-process receiver gets this storage back (torch's cache, as its reducers fill it)
    shared_cache[(_BACKEND, handle, nbytes)] = StorageWeakRef(storage)
    return (handle, nbytes, storage.device.index, *_sent.take(storage))


def _make_reducers():
    from torch.multiprocessing import reductions

    torch_reduce_tensor, torch_reduce_storage = reductions.reduce_tensor, reductions.reduce_storage

    def reduce_tensor(tensor):
        if tensor.device.type != _BACKEND or tensor.layout != torch.strided or tensor.is_nested:
            return torch_reduce_tensor(tensor)
        if tensor.requires_grad and not tensor.is_leaf:
            raise RuntimeError(  # torch's message for every device
                "Cowardly refusing to serialize non-leaf tensor which requires_grad, "
                "since autograd does not support crossing process boundaries.  "
                "If you just want to transfer the data, call detach() on the tensor "
                "before serializing (e.g., putting it on the queue)."
            )
        storage = tensor.untyped_storage()
        return (
            _rebuild_tensor,
            (type(tensor), tensor.size(), tensor.stride(), tensor.storage_offset(), tensor.dtype,
             tensor.requires_grad, *_storage_args(storage)),
        )

    def reduce_storage(storage):
        if storage.device.type != _BACKEND:
            return torch_reduce_storage(storage)
        return (_rebuild_storage, _storage_args(storage))

    return reduce_tensor, reduce_storage


def _register() -> None:
    """Registers the reducers with multiprocessing's ForkingPickler (after torch's own, which torch.multiprocessing
    installs at ``import torch``; other devices keep torch's)."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (torch's reducers first)

    reduce_tensor, reduce_storage = _make_reducers()
    for cls in (torch.Tensor, torch.nn.parameter.Parameter):
        ForkingPickler.register(cls, reduce_tensor)
    ForkingPickler.register(torch.UntypedStorage, reduce_storage)
    from .patches import record

    record("multiprocessing.vnpu-tensors", "multiprocessing.reduction.ForkingPickler reducers")
