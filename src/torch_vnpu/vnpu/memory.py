"""vnpu memory management (mirrors ``torch.cuda.memory``). All sizes are bytes."""

import collections
import contextlib
import pickle
import sys
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .. import _C


def _index(device) -> int:
    from . import _get_device_index

    return _get_device_index(device)


def empty_cache() -> None:
    """Returns all unused cached blocks to the devices (waits for queued work first)."""
    _C._empty_cache()


def memory_stats_as_nested_dict(device=None) -> Dict[str, Any]:
    """The caching allocator's statistics as nested dicts; ``{}`` before the runtime is initialized, so that
    querying (``memory_allocated()`` and friends give 0) does not initialize it, as ``torch.cuda``'s.

    Raises:
        RuntimeError: another allocator was installed with :func:`change_current_allocator` (as on CUDA)."""
    if not _C._is_initialized() and _C._is_caching_allocator_current():
        return {}
    return _C._memory_stats(_index(device))


def memory_stats(device=None) -> "collections.OrderedDict[str, int]":
    """Allocator statistics in the flat format of ``torch.cuda.memory_stats``
    (e.g. ``allocated_bytes.all.current``, ``reserved_bytes.all.peak``, ``num_ooms``)."""
    return _flatten(memory_stats_as_nested_dict(device))


def _flatten(nested: Dict[str, Any]) -> "collections.OrderedDict[str, int]":
    """Nested statistics as torch.cuda's flat, sorted ``a.b.c`` keys."""
    result = []

    def add(prefix: str, obj: Any) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                add(f"{prefix}.{k}" if prefix else k, v)
        else:
            result.append((prefix, obj))

    add("", nested)
    result.sort()
    return collections.OrderedDict(result)


def memory_allocated(device=None) -> int:
    """Bytes currently occupied by tensors on ``device``."""
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device=None) -> int:
    """Peak of ``memory_allocated`` since start or the last ``reset_peak_memory_stats``."""
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device=None) -> int:
    """Bytes held by the caching allocator on ``device`` (allocated + cached)."""
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device=None) -> int:
    """Peak of :func:`memory_reserved` (bytes) since start or the last :func:`reset_peak_memory_stats`, as
    ``torch.cuda.max_memory_reserved``."""
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device=None) -> None:
    """Resets the ``peak`` values of :func:`memory_stats` (``max_memory_allocated``, ``max_memory_reserved``, ...)
    of ``device`` to their current values, as ``torch.cuda.reset_peak_memory_stats``."""
    _C._reset_peak_memory_stats(_index(device))


def reset_max_memory_allocated(device=None) -> None:
    """Resets the peak of :func:`max_memory_allocated` (as ``torch.cuda.reset_max_memory_allocated``: it resets
    every peak statistic, like :func:`reset_peak_memory_stats`)."""
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device=None) -> None:
    """Resets the accumulated counters of :func:`memory_stats` (``allocation.*.allocated``/``freed``, segment and
    OOM counts, ...) of ``device``, as ``torch.cuda.reset_accumulated_memory_stats``."""
    _C._reset_accumulated_memory_stats(_index(device))


def memory_cached(device=None) -> int:
    """Deprecated alias of :func:`memory_reserved` (as ``torch.cuda.memory_cached``; FutureWarning)."""
    warnings.warn("torch.vnpu.memory_cached has been renamed to torch.vnpu.memory_reserved", FutureWarning,
                  stacklevel=2)
    return memory_reserved(device)


def max_memory_cached(device=None) -> int:
    """Deprecated alias of :func:`max_memory_reserved` (as ``torch.cuda.max_memory_cached``; FutureWarning)."""
    warnings.warn("torch.vnpu.max_memory_cached has been renamed to torch.vnpu.max_memory_reserved", FutureWarning,
                  stacklevel=2)
    return max_memory_reserved(device)


def reset_max_memory_cached(device=None) -> None:
    """Deprecated: resets every peak statistic (as ``torch.cuda.reset_max_memory_cached``; FutureWarning)."""
    warnings.warn("torch.vnpu.reset_max_memory_cached now calls torch.vnpu.reset_peak_memory_stats, which resets "
                  "/all/ peak memory stats.", FutureWarning, stacklevel=2)
    reset_peak_memory_stats(device)


def device_memory_used(device=None) -> int:
    """Bytes of ``device``'s memory in use (``total - free`` of :func:`mem_get_info`: every allocation on the
    device, cached blocks included), as ``torch.cuda.device_memory_used`` reports the device's used memory."""
    free, total = mem_get_info(device)
    return total - free


def list_gpu_processes(device=None) -> str:
    """The processes holding memory on ``device`` with their usage, in ``torch.cuda.list_gpu_processes``' format.
    vnpu device memory belongs to one process (IPC peers map it without owning it): this process is listed
    with :func:`memory_reserved`, or "no processes are running" when it holds none."""
    import os

    idx = _index(device)
    lines = [f"GPU:{idx}"]
    # With another allocator (change_current_allocator) the device's used memory is what this process holds.
    reserved = memory_reserved(idx) if _C._is_caching_allocator_current() else device_memory_used(idx)
    if reserved == 0:
        lines.append("no processes are running")
    else:
        lines.append(f"process {os.getpid():>10d} uses {reserved / 1024 ** 2:>12.3f} MB GPU memory")
    return "\n".join(lines)


def get_allocator_backend() -> str:
    """The device allocator's name, as ``torch.cuda.get_allocator_backend``: ``"native"`` (vnpu's caching
    allocator), also after :func:`change_current_allocator` (as CUDA reports its configured backend)."""
    return "native"


class VNPUPluggableAllocator:
    """A vnpu allocator made of two functions of a shared library, as ``torch.cuda.memory.CUDAPluggableAllocator``.

    Args:
        path_to_so_file: the shared library.
        alloc_fn_name: ``void* alloc(size_t size, int device, vnpuStream_t stream)``: ``size`` bytes of device
            memory (e.g. from ``vnpuMalloc``, csrc/runtime/include/vnpu/runtime.h) for use on ``stream``; NULL
            when out of memory (the allocation then raises ``torch.OutOfMemoryError``).
        free_fn_name: ``void free(void* ptr, size_t size, int device, vnpuStream_t stream)``: called with the
            allocation's size, device and stream when its storage dies, on the thread that drops it (autograd and
            collectives threads too): it must be thread-safe, and must not free memory that queued work on
            ``stream`` still uses (``vnpuFree`` waits for the device's queued work).

    Install it with :func:`change_current_allocator` before the first use of a vnpu device.

    Raises:
        OSError: the library cannot be loaded. AttributeError: a function is not in it.
    """

    def __init__(self, path_to_so_file: str, alloc_fn_name: str, free_fn_name: str):
        import ctypes

        self._lib = ctypes.CDLL(path_to_so_file)  # kept: the functions must outlive the allocator
        alloc = ctypes.cast(getattr(self._lib, alloc_fn_name), ctypes.c_void_p).value
        free = ctypes.cast(getattr(self._lib, free_fn_name), ctypes.c_void_p).value
        self._allocator = _C._create_pluggable_allocator(alloc, free)

    def allocator(self) -> int:
        """The C++ allocator (a ``c10::DeviceAllocator*``) as an integer."""
        return self._allocator


def change_current_allocator(allocator: VNPUPluggableAllocator) -> None:
    """Make ``allocator`` serve every later vnpu allocation, as ``torch.cuda.memory.change_current_allocator``.

    Raises:
        RuntimeError: a vnpu device was already used ("Can't swap an already initialized allocator"). Afterwards
            the caching allocator's statistics (``memory_stats``, ``memory_allocated``, ...), snapshots,
            graph memory pools and ``caching_allocator_alloc`` raise RuntimeError, as with CUDA's pluggable
            allocator; ``empty_cache`` does nothing.
    """
    _C._change_current_allocator(allocator.allocator())


def caching_allocator_enable(value: bool = True) -> None:
    """Turn the caching allocator on or off, as ``torch.cuda.memory.caching_allocator_enable``. Off, each
    allocation is its own device allocation (``vnpuMalloc``) and each free returns it at once (``vnpuFree``,
    which waits for the device's queued work): memory is never cached, and such allocations are not counted in
    the statistics. On (the default), allocations come from the cache again."""
    _C._set_caching_allocator_enabled(bool(value))


def mem_get_info(device=None) -> Tuple[int, int]:
    """(free, total) bytes of the device's memory (capacity: ``VNPU_MEMORY_PER_DEVICE``)."""
    free, total = _C._mem_get_info(_index(device))
    return int(free), int(total)


def host_memory_stats_as_nested_dict() -> Dict[str, Any]:
    """Pinned host memory statistics (``torch.vnpu.host_memory_stats``) as nested dicts; ``{}`` before the
    runtime is initialized, as ``torch.cuda``'s."""
    if not _C._is_initialized():
        return {}
    return _C._host_memory_stats()


def host_memory_stats() -> "collections.OrderedDict[str, int]":
    """The pinned host memory allocator's statistics in ``torch.cuda.host_memory_stats``'s flat format:
    ``allocations`` / ``allocated_bytes`` (blocks the allocator owns, cached ones included; sizes rounded up to
    a power of two), ``active_requests`` / ``active_bytes`` (blocks handed out), each ``.current``, ``.peak``,
    ``.allocated``, ``.freed``; ``num_host_alloc`` / ``num_host_free`` (blocks created / returned) and
    ``host_alloc_time`` / ``host_free_time`` (torch.cuda's keys; not timed on vnpu yet: 0)."""
    return _flatten(host_memory_stats_as_nested_dict())


def reset_accumulated_host_memory_stats() -> None:
    """Resets the ``allocated`` / ``freed`` counters and timing totals of :func:`host_memory_stats`."""
    _C._host_reset_accumulated_stats()


def reset_peak_host_memory_stats() -> None:
    """Resets the ``peak`` values of :func:`host_memory_stats` to the current ones."""
    _C._host_reset_peak_stats()


def caching_allocator_alloc(size: int, device=None, stream=None) -> int:
    """``size`` bytes of device memory from the caching allocator, as ``torch.cuda.caching_allocator_alloc``:
    returns the address (int; 0 for 0 bytes), usable on ``stream`` (a ``torch.vnpu.Stream`` or its
    ``vnpu_stream`` handle; default the device's current stream), freed with
    :func:`caching_allocator_delete`. Counted in ``memory_allocated()``. Raises ``torch.OutOfMemoryError``
    when the device is full, TypeError for another kind of ``stream``, ValueError for a stream of another
    device."""
    from . import _lazy_init, current_stream

    _lazy_init()
    index = _index(device)
    if stream is None:
        stream = current_stream(index)
    if isinstance(stream, torch.Stream):
        if stream.device.type != "vnpu" or stream.device.index != index:
            raise ValueError(f"stream {stream} is not a stream of vnpu:{index}")
        stream = _C._stream_handle(stream.stream_id, stream.device_index, stream.device_type)
    if not isinstance(stream, int) or isinstance(stream, bool):
        raise TypeError("Invalid type for stream argument, must be `torch.vnpu.Stream` or `int` representing a "
                        "pointer to a existing stream")
    return _C._caching_allocator_alloc(size, index, stream)


def caching_allocator_delete(mem_ptr: int) -> None:
    """Frees memory from :func:`caching_allocator_alloc` (``torch.cuda.caching_allocator_delete``): the block goes
    back to the cache in the order of its stream. RuntimeError for an address that is not such a live block."""
    _C._caching_allocator_delete(mem_ptr)


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    """Limits the device memory this process's caching allocator reserves on ``device`` (default: the
    current one) to ``fraction`` x its capacity (``VNPU_MEMORY_PER_DEVICE``), as
    ``torch.cuda.set_per_process_memory_fraction``: a request past the limit first releases cached blocks,
    then raises ``torch.OutOfMemoryError`` ("... N allowed; ...", naming the limit). Memory reserved
    already stays; the limit applies to what is reserved next.

    Raises TypeError for a ``fraction`` that is not a float, ValueError outside 0~1 (CUDA's messages).
    """
    from . import _lazy_init

    _lazy_init()
    index = _index(device)
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    _C._set_memory_fraction(fraction, index)


def get_per_process_memory_fraction(device=None) -> float:
    """The fraction :func:`set_per_process_memory_fraction` set for ``device`` (1.0 if never set)."""
    from . import _lazy_init

    _lazy_init()
    return _C._get_memory_fraction(_index(device))


def memory_snapshot(mempool_id: Optional[Tuple[int, int]] = None) -> list:
    """Segments and blocks of every device, in the layout of ``torch.cuda.memory_snapshot()``: the
    ``"segments"`` of :func:`_snapshot` (with stacks while memory history is recorded). With ``mempool_id`` (a
    :class:`MemPool`'s ``id`` or a graph pool), only that pool's segments (``segment_pool_id``)."""
    segments = _C._memory_snapshot()
    if mempool_id is not None:
        segments = [seg for seg in segments if tuple(seg["segment_pool_id"]) == tuple(mempool_id)]
    return segments


class MemPool:
    """A private pool of vnpu's caching allocator, as ``torch.cuda.MemPool``: tensors allocated inside
    :func:`use_mem_pool` come from the pool's own segments, which no other allocation reuses; the pool's memory
    goes back to the device (at :func:`empty_cache`) once the pool and every tensor in it are gone.

    Args:
        allocator: must be None (vnpu has one allocator; ``torch.cuda``'s pluggable allocators have no vnpu
            equivalent): anything else raises NotImplementedError.
        use_on_oom (bool): must be False (NotImplementedError otherwise).
        no_split (bool): must be False (NotImplementedError otherwise).

    The pool lives on the device that is current when it is created (as CUDA's).
    """

    def __init__(self, allocator=None, use_on_oom: bool = False, no_split: bool = False):
        if allocator is not None or use_on_oom or no_split:
            raise NotImplementedError("torch.vnpu.MemPool supports the default allocator only (allocator=None, "
                                      "use_on_oom=False, no_split=False)")
        torch.vnpu._lazy_init()
        self._device = torch.vnpu.current_device()
        self._id = tuple(_C._graph_pool_handle())  # {0, n}: CUDA's ids of user-created pools
        _C._begin_allocate_current_thread_to_pool(self._device, self._id)  # creates it, held by this object
        _C._end_allocate_to_pool(self._device, self._id)

    @property
    def id(self) -> Tuple[int, int]:
        """The pool's id, a tuple of two ints (as ``torch.cuda.MemPool.id``)."""
        return self._id

    @property
    def allocator(self):
        """None: the pool uses vnpu's caching allocator."""
        return None

    def use_count(self) -> int:
        """Holders of the pool: 1 for the MemPool itself, plus open :func:`use_mem_pool` scopes and graphs
        captured into it (as ``torch.cuda.MemPool.use_count``)."""
        return _C._pool_use_count(self._device, self._id)

    def snapshot(self, include_traces: bool = True) -> list:
        """This pool's segments, in :func:`memory_snapshot`'s format (``include_traces`` is accepted for
        torch.cuda's signature; blocks carry their stacks while memory history is recorded)."""
        return memory_snapshot(self._id)

    def __del__(self):
        try:
            _C._release_pool(self._device, self._id)
        except Exception:  # interpreter shutdown
            pass


@contextlib.contextmanager
def use_mem_pool(pool: MemPool, device=None):
    """Routes the current thread's allocations on ``device`` (default: the current device) to ``pool`` inside
    the ``with`` block, as ``torch.cuda.use_mem_pool``: only this thread's (a backward pass on autograd's
    device threads allocates outside the pool, as on CUDA). Nests."""
    idx = _index(device)
    _C._begin_allocate_current_thread_to_pool(idx, pool.id)
    try:
        yield
    finally:
        _C._end_allocate_to_pool(idx, pool.id)
        _C._release_pool(idx, pool.id)


def _fmt(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A human-readable table of the allocator statistics of ``device``."""
    s = memory_stats(device)
    rows = [
        ("Allocated memory", "allocated_bytes", True),
        ("Active memory", "active_bytes", True),
        ("Requested memory", "requested_bytes", True),
        ("Reserved memory", "reserved_bytes", True),
        ("Non-releasable memory", "inactive_split_bytes", True),
        ("Allocations", "allocation", False),
        ("Active allocs", "active", False),
        ("Reserved segments", "segment", False),
    ]
    lines = [
        "=" * 79,
        f" vNPU memory summary, device ID {_index(device):<4} | num_ooms: {s.get('num_ooms', 0)}"
        f" | num_alloc_retries: {s.get('num_alloc_retries', 0)}",
        "-" * 79,
        f" {'Metric':<26}| {'Cur Usage':>11} | {'Peak Usage':>11} | {'Tot Alloc':>11} | {'Tot Freed':>11}",
        "-" * 79,
    ]
    pools = ("all",) if abbreviated else ("all", "large_pool", "small_pool")
    for title, key, is_bytes in rows:
        for pool in pools:
            vals = [s.get(f"{key}.{pool}.{k}", 0) for k in ("current", "peak", "allocated", "freed")]
            cells = [_fmt(v) if is_bytes else str(v) for v in vals]
            label = title if pool == "all" else f"  from {pool.replace('_pool', '')} pool"
            lines.append(f" {label:<26}| {cells[0]:>11} | {cells[1]:>11} | {cells[2]:>11} | {cells[3]:>11}")
    lines.append("=" * 79)
    return "\n".join(lines) + "\n"


def get_executed_ops() -> Dict[str, int]:
    """{op name: calls} of every ATen op the vnpu executor ran since start or ``reset_op_stats``."""
    return dict(_C._executed_ops())


def get_fallback_ops() -> Dict[str, Dict[str, Any]]:
    """{op name: {"reason": str, "count": int}} of ops that took a slower path than one
    stream-ordered kernel: they synchronized the stream and ran on the calling thread because their
    output metadata could not be inferred (no or failing Meta kernel). Ops whose outputs depend on
    the data (nonzero, unique, boolean masks, .item()) synchronize as on CUDA and are not listed."""
    return {k: {"reason": r, "count": c} for k, (r, c) in _C._fallback_ops().items()}


def get_extra_copy_ops() -> Dict[str, int]:
    """{op name: calls} of ops whose CPU kernel has no out= form: the result is computed into fresh
    memory on the stream's worker and copied into the device output (no synchronization, no host
    round trip; one extra device-side copy)."""
    return dict(_C._extra_copy_ops())


def reset_op_stats() -> None:
    """Clears the counters of :func:`get_executed_ops`, :func:`get_fallback_ops` and :func:`get_extra_copy_ops`
    (vnpu's own executor statistics; torch.cuda has no equivalent)."""
    _C._reset_op_stats()


# ---- Memory history and snapshots (torch.cuda.memory's private API, same formats) ----------------


_UNSET: Any = object()


def _record_memory_history(
    enabled: Optional[str] = "all",
    context: Optional[str] = _UNSET,
    stacks: str = _UNSET,
    max_entries: int = _UNSET,
    device=None,
    clear_history: bool = False,
    compile_context: bool = False,
    global_record_annotations: bool = False,
    skip_actions: Optional[List[str]] = None,
    **kwargs,
) -> None:
    """Records the stack of every allocation, and a history of allocator events, for :func:`_snapshot`
    (mirrors ``torch.cuda.memory._record_memory_history``; every vnpu device records).

    Args:
        enabled: ``None`` stops recording (and drops the history); ``"state"`` keeps the stack of each live
            allocation; ``"all"`` (default) also keeps the last ``max_entries`` events (``alloc``,
            ``free_requested``, ``free_completed``, ``segment_alloc``/``segment_free``,
            ``segment_map``/``segment_unmap`` with expandable segments, ``oom``, ``snapshot``) per device.
            ``True``/``False`` select CUDA's legacy signature (``record_context``, ``trace_alloc_max_entries``,
            ``trace_alloc_record_context``, ``record_context_cpp``, ``clear_history``).
        context: ``None`` (no stacks), ``"state"`` (live allocations), ``"alloc"`` (also allocation events),
            ``"all"`` (default; also free events).
        stacks: ``"python"`` (Python and TorchScript frames, from PyTorch's ``CapturedTraceback``) or ``"all"``
            (default; also C++ frames, which make :func:`_snapshot` slower to symbolize).
        max_entries: events kept per device (default ``sys.maxsize``), the oldest overwritten; at least 1
            (``0`` keeps one, as CUDA).
        clear_history: drop the events recorded so far.
        skip_actions: event names not to record (``"alloc"``, ``"free_requested"``, ...).
        compile_context, global_record_annotations: accepted for CUDA compatibility; vnpu records neither
            (a warning says so when set).

    Raises:
        RuntimeError: an ``enabled``/``context``/``stacks`` value other than those above, or an unknown action
            in ``skip_actions`` (CUDA's messages). TypeError: ``max_entries`` negative or not an int.
    """
    if isinstance(enabled, bool):  # CUDA's legacy signature (its positional order for the first three)
        legacy = {"record_context": True, "trace_alloc_max_entries": 1, "trace_alloc_record_context": False,
                  "record_context_cpp": False}
        for name, value in zip(("record_context", "trace_alloc_max_entries", "trace_alloc_record_context"),
                               (context, stacks, max_entries)):
            if value is not _UNSET:
                legacy[name] = value
        legacy.update(kwargs)
        _record_memory_history(
            "all" if enabled else None,
            context="alloc" if legacy["trace_alloc_record_context"] else (
                "state" if legacy["record_context"] else None),
            stacks="all" if legacy["record_context_cpp"] else "python",
            max_entries=legacy["trace_alloc_max_entries"],
            clear_history=clear_history,
            skip_actions=skip_actions,
        )
        return
    context = "all" if context is _UNSET else context
    stacks = "all" if stacks is _UNSET else stacks
    max_entries = sys.maxsize if max_entries is _UNSET else max_entries
    if kwargs:
        raise TypeError(f"_record_memory_history() got unexpected keyword arguments {sorted(kwargs)}")
    if compile_context or global_record_annotations:
        warnings.warn("torch.vnpu.memory._record_memory_history: compile_context and global_record_annotations "
                      "are not recorded on vnpu", UserWarning, stacklevel=2)
    from . import _lazy_init

    _lazy_init()
    _C._record_memory_history(enabled, context, stacks, max_entries, clear_history, list(skip_actions or []))


def _snapshot(device=None, augment_with_fx_traces: bool = False) -> Dict[str, Any]:
    """The allocator's state as ``torch.cuda.memory._snapshot()`` gives it: ``{"segments": [...],
    "device_traces": [[...] per device], "allocator_settings": {...}}``. Segments (all devices, by address)
    have ``device``, ``address``, ``total_size``, ``allocated_size``, ``active_size``, ``requested_size``,
    ``stream`` (the ``torch.vnpu.Stream.vnpu_stream`` handle), ``segment_type`` ("small"/"large"),
    ``segment_pool_id``, ``is_expandable``, ``frames`` and ``blocks`` (``address``, ``size``,
    ``requested_size``, ``state``, ``frames``: the stack that allocated it, while history is on). Trace
    entries have ``action``, ``addr`` (``device_free`` for ``oom``), ``size`` (bytes requested; segment
    bytes for segment events), ``stream``, ``time_us`` and ``frames`` (with ``context`` ``"alloc"``/``"all"``).
    Sizes are bytes; frames are ``{"filename", "line", "name"}``. Render it with
    ``python -m torch.cuda._memory_viz trace_plot snapshot.pickle -o out.html``."""
    s = _C._memory_snapshot_full() if _C._is_initialized() else {
        "segments": [], "device_traces": [[] for _ in range(_C._device_count())], "allocator_settings": {}}
    if augment_with_fx_traces:
        from torch._utils import _augment_memory_snapshot_stack_traces

        s = _augment_memory_snapshot_stack_traces(s)
    return s


def _dump_snapshot(filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False) -> None:
    """Pickles :func:`_snapshot` to ``filename`` (as ``torch.cuda.memory._dump_snapshot``; pytorch.org/memory_viz
    and ``torch.cuda._memory_viz`` read it). Raises OSError if the file cannot be written; the recorded
    history is kept either way."""
    s = _snapshot(augment_with_fx_traces=augment_with_fx_traces)
    with open(filename, "wb") as f:
        pickle.dump(s, f)


def _attach_out_of_memory_observer(observer: Callable[[int, int, int, int], None]) -> None:
    """Calls ``observer(device, alloc, device_allocated, device_free)`` at every vnpu out-of-memory, before
    ``torch.OutOfMemoryError`` is raised (as ``torch.cuda.memory._attach_out_of_memory_observer``): ``alloc``
    is the bytes the device was asked for (the new segment or pages), ``device_allocated`` the device's
    capacity (CUDA passes its total memory there too), ``device_free`` its free bytes. The observer may call
    :func:`_dump_snapshot`; an exception it raises replaces the OutOfMemoryError. Observers stay attached for
    the life of the process. Raises TypeError if ``observer`` is not callable."""
    _C._attach_out_of_memory_observer(observer)
