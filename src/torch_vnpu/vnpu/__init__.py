"""``torch.vnpu``: the device module of the virtual NPU, mirroring ``torch.cuda``.

Semantics follow ``torch.cuda``: a current device per host thread, a current
stream per device and thread, asynchronous kernels whose errors surface at the
next synchronizing call (``VNPU_LAUNCH_BLOCKING=1`` raises them at once), a
caching allocator whose statistics use the ``torch.cuda.memory_stats`` format.
Devices: ``VNPU_DEVICE_COUNT`` (default 2), ``VNPU_VISIBLE_DEVICES``; memory
per device: ``VNPU_MEMORY_PER_DEVICE`` (bytes, K/M/G suffixes; default 8G).
"""

import atexit
import operator
import threading
import warnings
from typing import Any, NamedTuple, Union

import torch

from .. import _C
from . import amp, graphs, memory, random, streams  # noqa: F401
from .graphs import VNPUGraph, graph, graph_pool_handle, is_current_stream_capturing, make_graphed_callables
from .memory import (
    MemPool,
    caching_allocator_alloc,
    caching_allocator_delete,
    device_memory_used,
    empty_cache,
    caching_allocator_enable,
    change_current_allocator,
    get_allocator_backend,
    list_gpu_processes,
    max_memory_cached,
    memory_cached,
    reset_max_memory_cached,
    get_fallback_ops,
    get_executed_ops,
    get_extra_copy_ops,
    get_per_process_memory_fraction,
    host_memory_stats,
    host_memory_stats_as_nested_dict,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    memory_stats_as_nested_dict,
    memory_summary,
    reset_accumulated_host_memory_stats,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_op_stats,
    reset_peak_host_memory_stats,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
    use_mem_pool,
)
from .random import (
    default_generators,
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from .streams import (Event, ExternalStream, Stream, StreamContext, current_stream, default_stream,
                      get_stream_from_external, set_stream, stream)
from ._storage import (  # legacy typed storages, as torch.cuda.*Storage
    BFloat16Storage,
    BoolStorage,
    ByteStorage,
    CharStorage,
    ComplexDoubleStorage,
    ComplexFloatStorage,
    DoubleStorage,
    FloatStorage,
    HalfStorage,
    IntStorage,
    LongStorage,
    ShortStorage,
)
from ._storage import __all__ as _storage_all

__all__ = [
    "Event", "Stream", "StreamContext", "VNPUGraph", "amp", "current_device", "graph", "graph_pool_handle",
    "graphs", "is_current_stream_capturing", "make_graphed_callables", "current_stream", "default_generators",
    "default_stream", "device", "device_count", "device_of", "empty_cache", "get_amp_supported_dtype",
    "get_device_capability", "get_device_name", "get_device_properties", "get_executed_ops", "get_extra_copy_ops", "get_fallback_ops",
    "get_rng_state", "get_rng_state_all", "init", "initial_seed", "ipc_collect", "is_available", "is_bf16_supported",
    "is_initialized", "manual_seed", "manual_seed_all", "max_memory_allocated", "max_memory_reserved",
    "mem_get_info", "memory_allocated", "memory_reserved", "memory_snapshot", "memory_stats", "memory_summary",
    "reset_accumulated_memory_stats", "reset_max_memory_allocated", "reset_op_stats", "reset_peak_memory_stats",
    "seed", "seed_all", "set_device", "set_rng_state", "set_rng_state_all", "set_stream", "stream",
    "synchronize", "set_sync_debug_mode", "get_sync_debug_mode", "set_per_process_memory_fraction",
    "get_per_process_memory_fraction", "host_memory_stats", "host_memory_stats_as_nested_dict",
    "reset_accumulated_host_memory_stats", "reset_peak_host_memory_stats", "memory_stats_as_nested_dict",
    "OutOfMemoryError", "AcceleratorError", "caching_allocator_alloc", "caching_allocator_delete",
    "is_tf32_supported", "can_device_access_peer", "device_memory_used", "get_allocator_backend",
    "list_gpu_processes", "MemPool", "use_mem_pool", "caching_allocator_enable", "change_current_allocator", "utilization", "memory_usage", "ExternalStream", "get_stream_from_external", "memory_cached", "max_memory_cached", "reset_max_memory_cached", "memory",
    "random", "streams",
] + _storage_all

# As torch.cuda's names for them (torch.cuda.OutOfMemoryError is torch.OutOfMemoryError).
OutOfMemoryError = torch.OutOfMemoryError
AcceleratorError = torch.AcceleratorError

_initialized = False  # this process called _C._init() (the runtime's own flag is the truth)
_init_lock = threading.Lock()
_configuration_warned = False

_device_t = Union[torch.device, str, int, None]


def _warn_configuration_once() -> None:
    """Issues the runtime's warnings about VNPU_* values it did not understand (once per process)."""
    global _configuration_warned
    if not _configuration_warned:
        _configuration_warned = True
        for line in _C._configuration_warnings().splitlines():
            warnings.warn(line, UserWarning, stacklevel=4)


def _lazy_init() -> None:
    """Initializes the device on first use (torch calls this before creating vnpu tensors); refuses to
    run in a child forked after the parent initialized vnpu (as CUDA). Discovery (``device_count``,
    seeding) does not initialize; see Note [Discovery and initialization] in the runtime."""
    global _initialized
    if _initialized and not _C._is_in_bad_fork():
        return
    with _init_lock:
        if _C._is_in_bad_fork():
            raise RuntimeError(
                "Cannot re-initialize vNPU in forked subprocess. To use vNPU with multiprocessing, "
                "you must use the 'spawn' start method"
            )
        _warn_configuration_once()
        _C._init()
        _initialized = True


def _port_mode_enabled() -> bool:
    from ..port import _cuda

    return _cuda.is_enabled()


def _get_device_index(device: _device_t, optional: bool = True) -> int:
    """Index of ``device`` (torch.device, 'vnpu:1', int, or None for the current device)."""
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type == "cuda" and _port_mode_enabled():  # torch.cuda.*(..., "cuda:1") under port mode
            device = torch.device("vnpu", device.index)
        if device.type != "vnpu":
            raise ValueError(f"Expected a vnpu device, but got: {device}")
        device = device.index
    if device is None:
        if not optional:
            raise ValueError("Expected a vnpu device with a specified index or an integer, but got: None")
        return current_device()
    return int(device)


def is_available() -> bool:
    """True if at least one vNPU device is visible. Never raises."""
    return device_count() > 0


# Fixed for the process's lifetime: torch.compile treats the calls as constants (as torch._dynamo's
# assume_constant_result does, without importing it) instead of breaking the graph at the C++ call.
is_available._dynamo_marked_constant = True  # type: ignore[attr-defined]


def is_initialized() -> bool:
    """True once vnpu was initialized in this process: by a call that initializes as on CUDA
    (``init``, ``get_device_properties``, ``current_device``, ``set_device``, creating a tensor or a
    stream, ``get_rng_state``), not by ``device_count``/``is_available`` or seeding. False in a child
    forked after that (as for CUDA), which then cannot use vnpu."""
    return bool(_C._is_initialized())


def init() -> None:
    """Initializes vNPU state explicitly (it otherwise happens on first use)."""
    _lazy_init()


def device_count() -> int:
    """Number of visible devices (``VNPU_DEVICE_COUNT``/``VNPU_VISIBLE_DEVICES``). Never raises and does
    not initialize the device (a fork afterwards leaves vnpu usable in the child, as CUDA's)."""
    _warn_configuration_once()
    return int(_C._device_count())


device_count._dynamo_marked_constant = True  # type: ignore[attr-defined]


def current_device() -> int:
    """Index of the current device of this thread (default 0)."""
    _lazy_init()
    return int(_C._current_device())


def set_device(device: _device_t) -> None:
    """Sets the current device. Raises RuntimeError for an index outside [0, device_count())."""
    _lazy_init()
    index = _get_device_index(device)
    if index >= 0:
        _C._set_device(index)


class device:
    """Context manager that changes the current device (like ``torch.cuda.device``)."""

    def __init__(self, device: _device_t):
        self.idx = _get_device_index(device, optional=True) if device is not None else -1
        self.prev_idx = -1

    def __enter__(self):
        if self.idx >= 0:
            _lazy_init()
            self.prev_idx = int(_C._exchange_device(self.idx))

    def __exit__(self, *args: Any):
        if self.prev_idx >= 0:
            _C._set_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that makes the device of tensor ``obj`` current."""

    def __init__(self, obj: torch.Tensor):
        super().__init__(obj.get_device() if obj.device.type == "vnpu" else None)


def synchronize(device: _device_t = None) -> None:
    """Waits for all work on ``device`` (as ``torch.cuda.synchronize``).

    Raises ``torch.AcceleratorError`` (a RuntimeError) for a kernel that failed asynchronously. Warnings
    that kernels raised while running on the device are issued here as Python warnings (or at the next
    vnpu op / copy to the host, whichever comes first), so ``warnings`` filters apply to them.
    """
    _lazy_init()
    _C._synchronize(_get_device_index(device))
    for message, deprecation in _C._take_worker_warnings():
        warnings.warn(message, DeprecationWarning if deprecation else UserWarning, stacklevel=2)


_SYNC_DEBUG_MODES = {"default": 0, "warn": 1, "error": 2}


def set_sync_debug_mode(debug_mode: Union[int, str]) -> None:
    """Reports host waits on vnpu work (as ``torch.cuda.set_sync_debug_mode``), to find what stalls a loop.

    debug_mode: ``"default"``/0 (allow), ``"warn"``/1 (a ``UserWarning`` "called a synchronizing vnpu
    operation: <what>" at each), ``"error"``/2 (``RuntimeError`` with that text, raised before the wait, so
    nothing is lost). Process-wide, all threads and devices.

    Reported, as on CUDA: blocking copies between vnpu and the host (``.cpu()``, ``.tolist()``, printing,
    ``torch.tensor(..., device="vnpu")``, ``copy_`` without ``non_blocking=True``), ``.item()`` /
    ``bool(t)``, ``Stream.synchronize()``, and ops whose output depends on the data or that check data
    on the host (``nonzero``, boolean-mask indexing, ``unique``, ...). Not reported, as on CUDA:
    ``torch.vnpu.synchronize()`` and ``Event.synchronize()`` (waits asked for explicitly) and collectives.
    Waits only vnpu makes (an op's first call with new input layouts, an empty input, sparse tensors)
    are reported as warnings in ``"warn"`` only, so code that runs under CUDA's ``"error"`` runs here.

    Raises RuntimeError for another string ("invalid value of debug_mode, expected one of `default`,
    `warn`, `error`"), a non-int ("invalid argument to set_sync_debug_mode") or an int outside 0-2.
    """
    if isinstance(debug_mode, str):
        if debug_mode not in _SYNC_DEBUG_MODES:
            raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`")
        debug_mode = _SYNC_DEBUG_MODES[debug_mode]
    if isinstance(debug_mode, bool):
        raise RuntimeError("invalid argument to set_sync_debug_mode")
    try:
        debug_mode = operator.index(debug_mode)  # ints, numpy ints (as CUDA's THPUtils_checkLong)
    except TypeError:
        raise RuntimeError("invalid argument to set_sync_debug_mode") from None
    _C._set_sync_debug_mode(debug_mode)


def get_sync_debug_mode() -> int:
    """The mode :func:`set_sync_debug_mode` set: 0 (default), 1 (warn) or 2 (error), as ``torch.cuda``."""
    return _C._get_sync_debug_mode()


class _DeviceProperties(NamedTuple):
    name: str
    total_memory: int  # bytes
    multi_processor_count: int
    major: int
    minor: int

    def __repr__(self) -> str:
        return (
            f"_VnpuDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // (1024 * 1024)}MB, "
            f"multi_processor_count={self.multi_processor_count})"
        )


def get_device_properties(device: _device_t = None) -> _DeviceProperties:
    """Name, total_memory (bytes), multi_processor_count, major, minor of ``device``."""
    _lazy_init()
    return _DeviceProperties(*_C._get_device_properties(_get_device_index(device)))


def get_device_name(device: _device_t = None) -> str:
    """The name of ``device`` (default: the current device), as ``torch.cuda.get_device_name``:
    ``get_device_properties(device).name``. Raises ``AssertionError``/``RuntimeError`` for an invalid device,
    as :func:`get_device_properties`."""
    return get_device_properties(device).name


def utilization(device: _device_t = None) -> int:
    """Percent (0-100) of the last second during which ``device`` (default: the current device) ran a kernel,
    copy or memset on any of its streams, as ``torch.cuda.utilization`` reports NVML's ``utilization.gpu``
    (the share of its sample period with a kernel running). Raises for an invalid device."""
    return int(_C._device_utilization(_get_device_index(device, optional=True)))


def memory_usage(device: _device_t = None) -> int:
    """Percent (0-100) of the last second during which ``device``'s memory was read or written, as
    ``torch.cuda.memory_usage``: every vnpu kernel, copy and memset works on device memory, so this is
    :func:`utilization`."""
    return utilization(device)


def get_device_capability(device: _device_t = None) -> tuple:
    """(major, minor) of the virtual ISA."""
    p = get_device_properties(device)
    return (p.major, p.minor)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """bfloat16 is supported natively (kernels are ATen's CPU kernels)."""
    return True


def is_tf32_supported() -> bool:
    """False: float32 matmuls and convolutions run CPU's float32 kernels, with no TF32 mode (as
    ``torch.cuda.is_tf32_supported()`` on a GPU before Ampere)."""
    return False


def can_device_access_peer(device: _device_t, peer_device: _device_t) -> bool:
    """Whether ``device`` can read and write ``peer_device``'s memory directly (``torch.cuda``'s, which asks
    ``cudaDeviceCanAccessPeer``): True for two different vnpu devices (they share the host's memory; copies
    between them run without staging), False for a device and itself, as CUDA answers.

    Raises AssertionError ("Invalid device id" / "Invalid peer device id") for an index outside the visible
    devices, as ``torch.cuda``.
    """
    _lazy_init()
    device = _get_device_index(device, optional=True)
    peer_device = _get_device_index(peer_device, optional=False)
    if device < 0 or device >= device_count():
        raise AssertionError("Invalid device id")
    if peer_device < 0 or peer_device >= device_count():
        raise AssertionError("Invalid peer device id")
    return device != peer_device


def get_amp_supported_dtype() -> list:
    """Dtypes accepted by ``torch.autocast("vnpu", dtype=...)``."""
    return [torch.float16, torch.bfloat16, torch.float32]


def ipc_collect() -> int:
    """Frees the vnpu memory this process sent through torch.multiprocessing once every receiver has released
    it (done at each send too), as ``torch.cuda.ipc_collect``; returns how many sent storages were released.
    See src/torch_vnpu/_multiprocessing_reductions.py."""
    from .. import _multiprocessing_reductions

    return _multiprocessing_reductions.ipc_collect()


def _is_in_bad_fork() -> bool:
    return bool(_C._is_in_bad_fork())


def _sleep(cycles: int) -> None:
    """Keeps the current stream busy for ``cycles`` nanoseconds (the vNPU's clock is 1 GHz), as
    ``torch.cuda._sleep`` spins a CUDA stream: a test helper for asynchronous behaviour."""
    _lazy_init()
    _C._sleep(int(cycles))


_at_exit_installed = False


def _install_at_exit() -> None:
    # Let queued kernels finish before the interpreter tears down ATen state.
    global _at_exit_installed
    if not _at_exit_installed:
        _at_exit_installed = True
        atexit.register(_drain_at_exit)


def _drain_at_exit() -> None:
    if is_initialized():
        for i in range(device_count()):
            try:
                _C._synchronize(i)
            except RuntimeError:
                pass


def __dir__() -> list:
    """The public API (``__all__``) and the submodules: not the modules this one imports for itself."""
    return sorted(set(__all__) | {"sanitizer"})


def __getattr__(name: str):
    if name == "sanitizer":  # imported on first use: `import torch` stays as fast
        import importlib

        return importlib.import_module("torch_vnpu.sanitizer")
    # Inductor's PrivateUse1 discovery reads torch.vnpu.Scheduling, .PythonWrapperCodegen, .CppWrapperCodegen
    # and .WrapperFxCodegen at the first compilation; answering registers torch.compile support lazily.
    from .._inductor import CODEGEN_NAMES, codegen_class

    if name in CODEGEN_NAMES:
        return codegen_class(name)
    raise AttributeError(f"module 'torch.vnpu' has no attribute '{name}'")
