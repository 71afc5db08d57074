"""vnpu memory management (mirrors ``torch.cuda.memory``). All sizes are bytes."""

import collections
from typing import Any, Dict, Tuple

from .. import _C


def _index(device) -> int:
    from . import _get_device_index

    return _get_device_index(device)


def empty_cache() -> None:
    """Returns all unused cached blocks to the devices (waits for queued work first)."""
    _C._empty_cache()


def memory_stats_as_nested_dict(device=None) -> Dict[str, Any]:
    """The caching allocator's statistics as nested dicts; ``{}`` before the runtime is initialized, so that
    querying (``memory_allocated()`` and friends give 0) does not initialize it, as ``torch.cuda``'s."""
    if not _C._is_initialized():
        return {}
    return _C._memory_stats(_index(device))


def memory_stats(device=None) -> "collections.OrderedDict[str, int]":
    """Allocator statistics in the flat format of ``torch.cuda.memory_stats``
    (e.g. ``allocated_bytes.all.current``, ``reserved_bytes.all.peak``, ``num_ooms``)."""
    result = []

    def add(prefix: str, obj: Any) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                add(f"{prefix}.{k}" if prefix else k, v)
        else:
            result.append((prefix, obj))

    add("", memory_stats_as_nested_dict(device))
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
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device=None) -> None:
    _C._reset_peak_memory_stats(_index(device))


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device=None) -> None:
    _C._reset_accumulated_memory_stats(_index(device))


def mem_get_info(device=None) -> Tuple[int, int]:
    """(free, total) bytes of the device's memory (capacity: ``VNPU_MEMORY_PER_DEVICE``)."""
    free, total = _C._mem_get_info(_index(device))
    return int(free), int(total)


def memory_snapshot() -> list:
    """Segments and blocks of every device, in the layout of ``torch.cuda.memory_snapshot()``."""
    return _C._memory_snapshot()


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
    _C._reset_op_stats()
