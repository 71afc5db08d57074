"""CUDA-only features of a CUDA script mapped to their vnpu equivalents in port mode (``_cuda.enable`` installs
them; ``_cuda.disable`` undoes them):

* ``torch.Generator(device="cuda[:i]")`` -> a vnpu generator (``torch.Generator`` stays a class: ``isinstance`` and
  its class attributes answer as before);
* CUDA's typed tensor classes: ``x.type(torch.cuda.FloatTensor)`` / ``x.type("torch.cuda.FloatTensor")`` ->
  ``x.to("vnpu", torch.float32)``; ``torch.cuda.FloatTensor(2, 3)`` / ``torch.cuda.FloatTensor([1, 2])`` -> a vnpu
  tensor of that dtype (``torch.empty`` / ``torch.tensor``); ``isinstance(x, torch.cuda.FloatTensor)`` is True
  for a float32 vnpu tensor;
* CUDA graphs: ``torch.cuda.CUDAGraph`` -> ``torch.vnpu.VNPUGraph``; ``graph``, ``make_graphed_callables``,
  ``graph_pool_handle`` -> torch.vnpu's;
* ``torch.cuda.nvtx`` ranges (``range_push``/``range_pop``, ``range_start``/``range_end``, ``range``, ``mark``) ->
  ``torch.profiler.record_function`` ranges, which the profiler records on any device.
"""

from __future__ import annotations

import contextlib
import threading

import torch

# torch.cuda.<name>Tensor -> dtype
_TYPED = {
    "FloatTensor": torch.float32, "DoubleTensor": torch.float64, "HalfTensor": torch.float16,
    "BFloat16Tensor": torch.bfloat16, "ByteTensor": torch.uint8, "CharTensor": torch.int8,
    "ShortTensor": torch.int16, "IntTensor": torch.int32, "LongTensor": torch.int64, "BoolTensor": torch.bool,
}
_GRAPHS = {"CUDAGraph": "VNPUGraph", "graph": "graph", "make_graphed_callables": "make_graphed_callables",
           "graph_pool_handle": "graph_pool_handle"}


def _generator_class(real: type, map_device) -> type:
    class _Meta(type(real)):
        def __call__(cls, device="cpu"):
            return real(map_device(device))

        def __instancecheck__(cls, obj):
            return isinstance(obj, real)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, real)

    return _Meta("Generator", (real,), {"__doc__": real.__doc__, "__module__": real.__module__})


class _TypedTensorMeta(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, torch.Tensor) and obj.device.type == "vnpu" and obj.dtype == cls.dtype

    def __call__(cls, *args, **kwargs):
        device = torch.device("vnpu", torch.vnpu.current_device())
        if len(args) == 1 and not isinstance(args[0], (int, torch.Size)):  # data (a list, a tensor, ...)
            return torch.tensor(args[0], dtype=cls.dtype, device=device)
        size = args[0] if len(args) == 1 and isinstance(args[0], torch.Size) else args
        return torch.empty(size, dtype=cls.dtype, device=device, **kwargs)


def typed_tensor_dtype(obj) -> torch.dtype | None:
    """The dtype of a CUDA typed tensor class given to ``Tensor.type`` (port mode's class, CUDA's own class, or
    its name ``"torch.cuda.FloatTensor"``), else None."""
    if isinstance(obj, _TypedTensorMeta):
        return obj.dtype
    name = obj if isinstance(obj, str) else getattr(obj, "__module__", "") + "." + getattr(obj, "__name__", "")
    if isinstance(name, str) and name.startswith("torch.cuda."):
        return _TYPED.get(name[len("torch.cuda."):])
    return None


class _Nvtx:
    """torch.cuda.nvtx on top of torch.profiler.record_function (one stack of open ranges per thread)."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._ids = {}
        self._next = 0

    def _stack(self) -> list:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        return self._local.stack

    def range_push(self, msg: str) -> int:
        rf = torch.profiler.record_function(msg)
        rf.__enter__()
        self._stack().append(rf)
        return len(self._stack()) - 1

    def range_pop(self) -> int:
        stack = self._stack()
        if not stack:
            return -1
        stack.pop().__exit__(None, None, None)
        return len(stack)

    def range_start(self, msg: str) -> int:
        rf = torch.profiler.record_function(msg)
        rf.__enter__()
        self._next += 1
        self._ids[self._next] = rf
        return self._next

    def range_end(self, range_id: int) -> None:
        rf = self._ids.pop(range_id, None)
        if rf is not None:
            rf.__exit__(None, None, None)

    def mark(self, msg: str) -> None:
        with torch.profiler.record_function(msg):
            pass

    @contextlib.contextmanager
    def range(self, msg: str, *args, **kwargs):
        with torch.profiler.record_function(msg.format(*args, **kwargs)):
            yield


def install(save, map_device) -> None:
    """Installs the mappings through ``save(owner, name, value)`` (which records what to restore)."""
    save(torch, "Generator", _generator_class(torch.Generator, map_device))
    for name, dtype in _TYPED.items():
        save(torch.cuda, name, _TypedTensorMeta(name, (), {"dtype": dtype, "__module__": "torch.cuda"}))
    for cuda_name, vnpu_name in _GRAPHS.items():
        if hasattr(torch.cuda, cuda_name) and hasattr(torch.vnpu, vnpu_name):
            save(torch.cuda, cuda_name, getattr(torch.vnpu, vnpu_name))
    import torch.cuda.graphs as cuda_graphs
    import torch.cuda.nvtx as nvtx

    for cuda_name, vnpu_name in _GRAPHS.items():
        if hasattr(cuda_graphs, cuda_name):
            save(cuda_graphs, cuda_name, getattr(torch.vnpu, vnpu_name))
    ranges = _Nvtx()
    for name in ("range_push", "range_pop", "range_start", "range_end", "mark", "range"):
        save(nvtx, name, getattr(ranges, name))
