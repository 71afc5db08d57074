"""Legacy typed storage classes ``torch.vnpu.FloatStorage``, ``DoubleStorage``, ... (as ``torch.cuda.*Storage``).

PyTorch finds them by name: ``x.storage_type()`` and ``x.storage().type()`` look up ``torch.<device>.<Name>Storage``
for the tensor's device and dtype, ``isinstance(x.storage(), torch.vnpu.FloatStorage)`` holds for a float32 vnpu
tensor, and ``torch.vnpu.FloatStorage(n)`` creates a storage of ``n`` elements on the current vnpu device. Like
CUDA's, these classes are deprecated upstream (TypedStorage); they exist so code written against the CUDA
spelling runs unchanged.
"""

import torch
from torch.storage import _LegacyStorage

__all__ = [
    "BFloat16Storage", "BoolStorage", "ByteStorage", "CharStorage", "ComplexDoubleStorage", "ComplexFloatStorage",
    "DoubleStorage", "FloatStorage", "HalfStorage", "IntStorage", "LongStorage", "ShortStorage",
]


class _VnpuLegacyStorage(_LegacyStorage):
    """Base of the vnpu legacy storages; what CUDA's refuses, these refuse too."""

    @classmethod
    def from_buffer(cls, *args, **kwargs):
        torch.storage._warn_typed_storage_removal()
        raise RuntimeError("from_buffer: Not available for vnpu storage")

    @classmethod
    def _new_with_weak_ptr(cls, *args, **kwargs):
        raise RuntimeError("_new_with_weak_ptr: Not available for vnpu storage")

    @classmethod
    def _new_shared_filename(cls, manager, obj, size, *, device=None, dtype=None):
        raise RuntimeError("_new_shared_filename: Not available for vnpu storage")


def _make(name: str, dtype: torch.dtype) -> type:
    def _dtype_prop(cls):
        torch.storage._warn_typed_storage_removal()
        return dtype

    cls = type(name, (_VnpuLegacyStorage,), {
        # torch.storage reads `dtype` (warning about TypedStorage) and `_dtype` (silently) on the class.
        "dtype": torch._utils.classproperty(_dtype_prop),
        "_dtype": torch._utils.classproperty(lambda cls: dtype),
        "__module__": "torch.vnpu",  # torch.storage maps a class to its device by its module's last part
        "__qualname__": name,
        "__doc__": f"Legacy typed storage of {dtype} elements on vnpu, as torch.cuda.{name} (deprecated upstream: "
                   "use tensor.untyped_storage()).",
    })
    torch._storage_classes.add(cls)
    return cls


BFloat16Storage = _make("BFloat16Storage", torch.bfloat16)
BoolStorage = _make("BoolStorage", torch.bool)
ByteStorage = _make("ByteStorage", torch.uint8)
CharStorage = _make("CharStorage", torch.int8)
ComplexDoubleStorage = _make("ComplexDoubleStorage", torch.cdouble)
ComplexFloatStorage = _make("ComplexFloatStorage", torch.cfloat)
DoubleStorage = _make("DoubleStorage", torch.double)
FloatStorage = _make("FloatStorage", torch.float)
HalfStorage = _make("HalfStorage", torch.half)
IntStorage = _make("IntStorage", torch.int)
LongStorage = _make("LongStorage", torch.long)
ShortStorage = _make("ShortStorage", torch.short)
