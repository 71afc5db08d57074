"""The vnpu caching allocator, observed through memory_stats()/memory_snapshot() with the semantics of
PyTorch's CUDA caching allocator: per-stream block reuse, splitting of 2 MiB small-pool segments,
large-pool splitting, empty_cache returning unused segments, record_stream, OOM behaviour."""
import gc

import pytest
import torch

v = torch.vnpu
KiB, MiB, GiB = 1024, 1024**2, 1024**3


@pytest.fixture(autouse=True)
def _quiet_allocator():
    # Tensors kept alive by reference cycles (e.g. tracebacks of earlier failed tests) would pin
    # segments of pool streams that fresh_stream() may hand out again, or be freed mid-test by the
    # cyclic GC and disturb the statistics: collect them now and keep the GC off during the test.
    gc.collect()
    v.synchronize()
    v.empty_cache()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
    v.synchronize()
    v.empty_cache()


def stats(device=0):
    return v.memory_stats(device)


def delta(after, before, *keys):
    return {k: after[k] - before[k] for k in keys}


def segments(device=0):
    return [s for s in v.memory_snapshot() if s["device"] == device]


def fresh_stream():
    """A stream with no cached blocks (the fixture emptied the cache; streams come from a pool)."""
    return v.Stream()


# --------------------------------------------------------------------------- reuse


@pytest.mark.parametrize("nbytes", [4 * KiB, 1 * MiB, 6 * MiB, 32 * MiB], ids=["4KiB", "1MiB", "6MiB", "32MiB"])
def test_freed_block_is_reused_by_same_size_allocation_on_same_stream(nbytes):
    s = fresh_stream()
    with v.stream(s):
        x = torch.empty(nbytes, dtype=torch.uint8, device="vnpu")
        ptr = x.data_ptr()
        x.fill_(1)
        del x                                  # freed on the host while the fill may still be queued
        before = stats()
        y = torch.empty(nbytes, dtype=torch.uint8, device="vnpu")
        after = stats()
    assert y.data_ptr() == ptr
    d = delta(after, before, "reserved_bytes.all.current", "num_device_alloc", "segment.all.current")
    assert d == {"reserved_bytes.all.current": 0, "num_device_alloc": 0, "segment.all.current": 0}
    assert after["allocation.all.current"] - before["allocation.all.current"] == 1
    del y


def test_reuse_in_a_loop_does_not_grow_reserved():
    x = torch.randn(256, 256, device="vnpu")
    for _ in range(3):
        (x @ x).relu_()
    v.synchronize()
    before = stats()
    for _ in range(50):
        (x @ x).relu_()                        # temporaries of the same sizes, freed every iteration
    v.synchronize()
    after = stats()
    assert delta(after, before, "reserved_bytes.all.current", "num_device_alloc") == {
        "reserved_bytes.all.current": 0, "num_device_alloc": 0}
    assert after["allocation.all.allocated"] - before["allocation.all.allocated"] >= 50


def test_freed_block_is_not_given_to_another_stream():
    """Blocks are cached per stream: without record_stream/events another stream must not get them."""
    s1, s2 = fresh_stream(), fresh_stream()
    with v.stream(s1):
        x = torch.empty(MiB, dtype=torch.uint8, device="vnpu")
        ptr = x.data_ptr()
        del x
    with v.stream(s2):
        y = torch.empty(MiB, dtype=torch.uint8, device="vnpu")
        assert y.data_ptr() != ptr
    with v.stream(s1):
        z = torch.empty(MiB, dtype=torch.uint8, device="vnpu")
        assert z.data_ptr() == ptr
    del y, z


def test_record_stream_block_reused_after_the_stream_finished():
    s = fresh_stream()
    x = torch.ones(MiB // 4, device="vnpu")
    ptr = x.data_ptr()
    s.wait_stream(v.current_stream())
    with v.stream(s):
        y = x * 2
    x.record_stream(s)
    before = stats()
    del x
    after = stats()
    # allocated drops at once (as CUDA), the block stays active until s's work is done
    assert before["allocated_bytes.all.current"] - after["allocated_bytes.all.current"] == MiB
    s.synchronize()
    z = torch.empty(MiB // 4, device="vnpu")
    assert z.data_ptr() == ptr
    assert stats()["num_device_alloc"] == after["num_device_alloc"]
    assert torch.equal(y.cpu(), torch.full((MiB // 4,), 2.0))


# --------------------------------------------------------------------------- splitting


@pytest.mark.parametrize("n,size", [(8, 4 * KiB), (5, 100 * KiB), (3, 512)])
def test_small_allocations_share_one_2MiB_segment(n, size):
    s = fresh_stream()
    before = stats()
    with v.stream(s):
        ts = [torch.empty(size, dtype=torch.uint8, device="vnpu") for _ in range(n)]
    after = stats()
    d = delta(after, before, "segment.all.current", "segment.small_pool.current", "allocation.all.current",
              "allocation.small_pool.current", "reserved_bytes.all.current", "num_device_alloc",
              "allocated_bytes.all.current")
    assert d["segment.all.current"] == 1 and d["segment.small_pool.current"] == 1
    assert d["allocation.all.current"] == n and d["allocation.small_pool.current"] == n
    assert d["reserved_bytes.all.current"] == 2 * MiB
    assert d["num_device_alloc"] == 1
    assert d["allocated_bytes.all.current"] == n * size
    # all blocks lie inside that one segment
    ptrs = sorted(t.data_ptr() for t in ts)
    assert ptrs[-1] + size - ptrs[0] <= 2 * MiB
    # freeing them all leaves the segment cached but unused
    del ts
    after_free = stats()
    assert after_free["allocation.all.current"] == before["allocation.all.current"]
    assert after_free["segment.all.current"] == after["segment.all.current"]


def test_large_free_block_is_split_for_a_smaller_request():
    s = fresh_stream()
    with v.stream(s):
        big = torch.empty(16 * MiB, dtype=torch.uint8, device="vnpu")
        ptr = big.data_ptr()
        del big
        before = stats()
        a = torch.empty(4 * MiB, dtype=torch.uint8, device="vnpu")
        b = torch.empty(4 * MiB, dtype=torch.uint8, device="vnpu")
        after = stats()
    assert a.data_ptr() == ptr                  # best fit: the cached 16 MiB block, split
    assert delta(after, before, "num_device_alloc", "reserved_bytes.all.current") == {
        "num_device_alloc": 0, "reserved_bytes.all.current": 0}
    assert after["allocation.large_pool.current"] - before["allocation.large_pool.current"] == 2
    del a, b


def test_small_and_large_pools_are_separate():
    before = stats()
    a = torch.empty(1 * MiB, dtype=torch.uint8, device="vnpu")      # <= 1 MiB: small pool
    b = torch.empty(1 * MiB + 1, dtype=torch.uint8, device="vnpu")  # > 1 MiB: large pool
    after = stats()
    assert after["allocation.small_pool.current"] - before["allocation.small_pool.current"] == 1
    assert after["allocation.large_pool.current"] - before["allocation.large_pool.current"] == 1
    assert after["allocated_bytes.small_pool.current"] - before["allocated_bytes.small_pool.current"] == MiB
    assert after["allocated_bytes.large_pool.current"] - before["allocated_bytes.large_pool.current"] == MiB + 512
    del a, b


# --------------------------------------------------------------------------- empty_cache


def test_empty_cache_returns_segments():
    s0 = stats()
    ts = [torch.empty(sz, dtype=torch.uint8, device="vnpu") for sz in (1000, 300 * KiB, 3 * MiB, 25 * MiB)]
    mid = stats()
    assert mid["segment.all.current"] > s0["segment.all.current"]
    del ts
    cached = stats()
    assert cached["allocated_bytes.all.current"] == s0["allocated_bytes.all.current"]
    assert cached["reserved_bytes.all.current"] == mid["reserved_bytes.all.current"]  # still cached
    v.empty_cache()
    after = stats()
    assert after["reserved_bytes.all.current"] == s0["reserved_bytes.all.current"]
    assert after["segment.all.current"] == s0["segment.all.current"]
    assert after["num_device_free"] - cached["num_device_free"] == (mid["segment.all.current"]
                                                                   - s0["segment.all.current"])
    # what remains reserved is exactly the segments that still hold live blocks
    segs = segments()
    assert all(seg["allocated_size"] > 0 for seg in segs)
    assert sum(seg["total_size"] for seg in segs) == v.memory_reserved()
    if v.memory_allocated() == 0:
        assert v.memory_reserved() == 0 and after["segment.all.current"] == 0


def test_empty_cache_with_nothing_allocated_reserves_nothing():
    ts = [torch.ones(sz, device="vnpu") for sz in (10, 100_000, 2_000_000)]
    del ts
    v.empty_cache()
    if v.memory_allocated() != 0:
        pytest.skip(f"tensors from elsewhere in this process are alive ({v.memory_allocated()} bytes)")
    assert v.memory_reserved() == 0
    assert stats()["segment.all.current"] == 0
    assert segments() == []


def test_empty_cache_keeps_live_blocks_valid():
    x = torch.arange(1000.0, device="vnpu")
    tmp = torch.empty(5 * MiB, dtype=torch.uint8, device="vnpu")
    del tmp
    v.empty_cache()
    assert torch.equal((x + 1).cpu(), torch.arange(1000.0) + 1)
    assert v.memory_reserved() >= v.memory_allocated() > 0


# --------------------------------------------------------------------------- snapshot


def test_memory_snapshot_lists_segments_with_blocks():
    s = fresh_stream()
    with v.stream(s):
        small = [torch.empty(4 * KiB, dtype=torch.uint8, device="vnpu") for _ in range(3)]
        large = torch.empty(3 * MiB, dtype=torch.uint8, device="vnpu")
    snap = v.memory_snapshot()
    assert isinstance(snap, list) and snap
    for seg in snap:
        for key in ("device", "address", "total_size", "allocated_size", "active_size", "stream",
                    "segment_type", "blocks"):
            assert key in seg, key
        assert seg["segment_type"] in ("small", "large")
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        addr = seg["address"]
        for b in seg["blocks"]:                  # blocks tile the segment in address order
            assert b["address"] == addr
            assert b["state"] in ("active_allocated", "active_pending_free", "inactive")
            addr += b["size"]
        assert seg["allocated_size"] == sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")

    def seg_of(ptr):
        found = [seg for seg in segments() if seg["address"] <= ptr < seg["address"] + seg["total_size"]]
        assert len(found) == 1
        return found[0]

    sseg = seg_of(small[0].data_ptr())
    assert sseg["segment_type"] == "small" and sseg["total_size"] == 2 * MiB
    assert all(seg_of(t.data_ptr())["address"] == sseg["address"] for t in small)
    live = {b["address"]: b for b in sseg["blocks"] if b["state"] == "active_allocated"}
    assert {t.data_ptr() for t in small} <= set(live)
    assert all(live[t.data_ptr()]["size"] == 4 * KiB for t in small)
    lseg = seg_of(large.data_ptr())
    assert lseg["segment_type"] == "large"
    block = next(b for b in lseg["blocks"] if b["address"] == large.data_ptr())
    assert block["state"] == "active_allocated" and block["size"] == 3 * MiB
    # the snapshot follows frees
    addr = small[1].data_ptr()
    del small[1]
    freed = next(b for b in seg_of(addr)["blocks"] if b["address"] <= addr < b["address"] + b["size"])
    assert freed["state"] == "inactive"
    del small, large


# --------------------------------------------------------------------------- out of memory


def test_oom_raises_and_process_stays_healthy():
    total = v.get_device_properties(0).total_memory
    ooms = stats()["num_ooms"]
    before = v.memory_allocated()
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(total + GiB, dtype=torch.uint8, device="vnpu")
    msg = str(info.value)
    assert "out of memory" in msg.lower() and "Tried to allocate" in msg
    assert stats()["num_ooms"] == ooms + 1
    assert v.memory_allocated() == before
    assert torch.equal((torch.ones(4, device="vnpu") * 2).cpu(), torch.full((4,), 2.0))


def test_mem_pool_routes_this_threads_allocations_as_cuda():
    """torch.vnpu.MemPool / use_mem_pool with torch.cuda's semantics: use_count 1 for the pool, +1 inside the
    scope; this thread's tensors inside come from the pool's own segments, other threads' and later ones not;
    the pool's memory goes back at empty_cache once the pool and its tensors are gone."""
    import threading

    v = torch.vnpu
    v.synchronize()
    v.empty_cache()
    pool = v.MemPool()
    assert len(pool.id) == 2 and pool.use_count() == 1 and pool.allocator is None
    before = torch.empty(1000, device="vnpu")
    other = {}
    with v.use_mem_pool(pool):
        assert pool.use_count() == 2
        inside = torch.empty(1 << 20, device="vnpu")
        derived = inside + 1
        t = threading.Thread(target=lambda: other.setdefault("t", torch.empty(1 << 20, device="vnpu")))
        t.start()
        t.join()
    after = torch.empty(1 << 20, device="vnpu")
    assert pool.use_count() == 1
    segments = [(s["address"], s["total_size"]) for s in pool.snapshot()]
    assert segments and all(tuple(s["segment_pool_id"]) == pool.id for s in pool.snapshot())

    def in_pool(x):
        return any(a <= x.data_ptr() < a + n for a, n in segments)

    assert in_pool(inside) and in_pool(derived)
    assert not in_pool(before) and not in_pool(after) and not in_pool(other["t"])
    assert torch.equal(derived.cpu(), inside.cpu() + 1)
    pool_bytes = sum(n for _, n in segments)
    del inside, derived
    reserved = v.memory_reserved()
    del pool
    gc.collect()
    v.empty_cache()
    assert v.memory_reserved() <= reserved - pool_bytes
    with pytest.raises(NotImplementedError, match="default allocator"):
        v.MemPool(use_on_oom=True)
