"""Allocator statistics stay exact whatever error surfaces where (issue 13, item 3).

A kernel error pending on the device (``torch._assert_async`` of a zero, which fails on the stream worker as a
device-side assert does on CUDA) surfaces at the next synchronizing call, and empty_cache() and the
out-of-memory retry synchronize: the error must be raised there while the caching allocator's books still match
what the runtime holds. Oracle: the runtime's own count of device memory in use (``mem_get_info``: total -
free, nothing else allocates device memory here) equals ``memory_reserved()`` and the segments listed by
``memory_snapshot()``; ``inactive_split`` counts blocks (its ``_bytes`` twin counts bytes)."""
import gc

import pytest
import torch

v = torch.vnpu
MiB = 1 << 20


@pytest.fixture(autouse=True)
def _clean():
    gc.collect()
    v.synchronize()
    v.empty_cache()
    yield
    try:
        v.synchronize()
    finally:
        v.empty_cache()


def _device_used(device):
    free, total = v.mem_get_info(device)
    return total - free


def _assert_books_match_device(device=0):
    reserved = v.memory_reserved(device)
    segments = [s for s in v.memory_snapshot() if s["device"] == device]
    assert sum(s["total_size"] for s in segments) == reserved, segments
    assert reserved == _device_used(device), "the allocator lists memory the runtime has freed (or vice versa)"
    st = v.memory_stats(device)
    assert st["segment.all.current"] == len(segments)
    # inactive_split: free blocks of split segments (a count), inactive_split_bytes: their bytes.
    free_split = [b for s in segments if len(s["blocks"]) > 1 for b in s["blocks"] if b["state"] == "inactive"]
    assert st["inactive_split.all.current"] == len(free_split)
    assert st["inactive_split_bytes.all.current"] == sum(b["size"] for b in free_split)


def _fail_on_device(device="vnpu:0"):
    torch._assert_async(torch.zeros((), device=device))  # fails on the worker: pending until the next sync


def test_kernel_error_surfacing_inside_empty_cache():
    x = torch.empty(32 * MiB, dtype=torch.uint8, device="vnpu")
    keep = torch.ones(1000, device="vnpu")  # a split small segment stays
    del x
    assert v.memory_reserved() == 32 * MiB + 2 * MiB
    _fail_on_device()
    with pytest.raises(torch.AcceleratorError, match="_assert_async"):
        v.empty_cache()
    _assert_books_match_device()
    assert v.memory_reserved() == 2 * MiB  # the cached 32 MiB segment is gone from the books too
    v.synchronize()  # reported once: nothing pending any more
    assert keep.sum().item() == 1000


def test_kernel_error_surfacing_inside_the_oom_retry():
    cap = v.get_device_properties(0).total_memory
    cached = torch.empty(cap // 2, dtype=torch.uint8, device="vnpu")  # address space only: no RAM is touched
    del cached  # cached, not returned
    reserved_before = v.memory_reserved()
    _fail_on_device()
    # Needs the cache released (retry), and the release synchronizes: the kernel error surfaces there.
    with pytest.raises(torch.AcceleratorError, match="_assert_async"):
        torch.empty(cap * 3 // 4, dtype=torch.uint8, device="vnpu")
    assert v.memory_reserved() == reserved_before - cap // 2
    _assert_books_match_device()
    assert v.memory_stats()["num_alloc_retries"] >= 1
    big = torch.empty(cap * 3 // 4, dtype=torch.uint8, device="vnpu")  # and the device works
    del big


def test_kernel_error_surfacing_while_waiting_for_record_stream_events():
    s = v.Stream()
    x = torch.empty(8 * MiB, dtype=torch.uint8, device="vnpu")
    with v.stream(s):
        v._sleep(20_000_000)
        x.record_stream(s)
    del x  # its reuse waits for an event on s
    _fail_on_device()
    with pytest.raises(torch.AcceleratorError, match="_assert_async"):
        v.empty_cache()
    _assert_books_match_device()
    assert v.memory_reserved() == 0


@pytest.mark.skipif(torch.vnpu.device_count() < 2, reason="needs 2 vnpu devices")
def test_error_on_one_device_does_not_stop_empty_cache_of_the_others():
    a = torch.empty(4 * MiB, dtype=torch.uint8, device="vnpu:0")
    b = torch.empty(4 * MiB, dtype=torch.uint8, device="vnpu:1")
    del a, b
    _fail_on_device("vnpu:0")
    with pytest.raises(torch.AcceleratorError):
        v.empty_cache()
    for d in (0, 1):
        assert v.memory_reserved(d) == 0
        _assert_books_match_device(d)


def test_inactive_split_counts_blocks():
    ts = [torch.empty(100_000, dtype=torch.uint8, device="vnpu") for _ in range(6)]  # one 2 MiB small segment
    del ts[1:4]  # ts[1..3] merge into one free block; the tail of the segment is another
    st = v.memory_stats()
    assert st["inactive_split.all.current"] == 2
    assert st["inactive_split.small_pool.current"] == 2
    assert st["inactive_split_bytes.all.current"] == 2 * MiB - 3 * 100_352
    _assert_books_match_device()
    del ts
    assert v.memory_stats()["inactive_split.all.current"] == 0
