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
- The sender must keep the tensor alive as long as a receiver uses it: freed memory goes back to the sender's
  caching allocator and may be reused (the receiver then reads other data; its mapping stays valid, so it
  never crashes). Unlike CUDA, no reference counts delay that reuse.
- Work queued on the sender's device when the tensor is pickled is finished first (the sender waits for the
  device; CUDA records an event the receiver waits on), so the receiver sees the values at the time of sending.
- Processes must be started with ``spawn`` or ``forkserver``: a process forked after vnpu was initialized
  cannot use vnpu (as with CUDA).
Errors: ``RuntimeError`` from the runtime when device memory cannot be exported (``VNPU_IPC=0``; expandable
segments, whose memory is not one shareable range) or the sender is gone before the receiver maps it.
"""

from __future__ import annotations

import os

import torch

__all__: list[str] = []

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


def _open(handle: bytes, nbytes: int, device: int) -> torch.UntypedStorage:
    """The storage named by ``handle``, shared with views already received in this process."""
    from torch.multiprocessing.reductions import StorageWeakRef, shared_cache, storage_from_cache

    from . import _C

    key = (_BACKEND, handle, nbytes)
    storage = storage_from_cache(torch.UntypedStorage, key)
    if storage is None:
        storage = _C._ipc_open_storage(handle, nbytes, device)
        shared_cache[key] = StorageWeakRef(storage)
    return storage


def _rebuild_storage(handle: bytes, nbytes: int, device: int, pid: int) -> torch.UntypedStorage:
    if nbytes == 0:
        return torch.UntypedStorage(0, device=torch.device(_BACKEND, device))
    return _open(handle, nbytes, device)


def _rebuild_tensor(cls, size, stride, offset, dtype, requires_grad, handle, nbytes, device, pid):
    storage = _rebuild_storage(handle, nbytes, device, pid)
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
        return (b"", 0, storage.device.index, os.getpid())
    handle = _handle(storage)
    shared_cache[(_BACKEND, handle, nbytes)] = StorageWeakRef(storage)  # a same-process receiver gets this storage back
    return (handle, nbytes, storage.device.index, os.getpid())


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
