"""Pinned (page-locked) host memory for vnpu and non_blocking copies through it."""
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

DEV = "vnpu"


def test_pin_memory_basics():
    x = torch.randn(4)
    assert not x.is_pinned()
    p = x.pin_memory()
    assert p.is_pinned()
    assert p.device.type == "cpu"
    assert p.untyped_storage().is_pinned()
    assert torch.equal(p, x)
    assert p.data_ptr() != x.data_ptr()
    # Pinning a pinned tensor returns it unchanged.
    assert p.pin_memory() is p
    assert torch.empty(3, 5, pin_memory=True).is_pinned()
    assert torch.zeros(7, dtype=torch.int64, pin_memory=True).is_pinned()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64])
def test_pin_memory_dtypes_and_noncontiguous(dtype):
    x = (torch.randn(6, 8) * 5).to(dtype)
    v = x[:, ::2]
    p = v.pin_memory()
    assert p.is_pinned()
    assert torch.equal(p, v)


def test_accelerator_is_vnpu():
    assert torch.accelerator.current_accelerator().type == "vnpu"


def test_dataloader_pin_memory_yields_pinned_batches():
    xs = torch.randn(10, 3)
    ys = torch.arange(10)
    dl = DataLoader(TensorDataset(xs, ys), batch_size=4, pin_memory=True)
    seen = []
    for a, b in dl:
        assert a.is_pinned() and b.is_pinned()
        seen.append((a, b))
    assert [a.shape[0] for a, _ in seen] == [4, 4, 2]
    assert torch.equal(torch.cat([a for a, _ in seen]), xs)
    assert torch.equal(torch.cat([b for _, b in seen]), ys)
    # Without pin_memory the batches are pageable.
    a, b = next(iter(DataLoader(TensorDataset(xs, ys), batch_size=4)))
    assert not a.is_pinned()


def test_dataloader_pinned_batches_with_worker_then_to_device():
    xs = torch.randn(12, 5)
    ys = torch.arange(12)
    dl = DataLoader(TensorDataset(xs, ys), batch_size=3, pin_memory=True, num_workers=1)
    got_x, got_y = [], []
    for a, b in dl:
        assert a.is_pinned() and b.is_pinned()
        got_x.append(a.to(DEV, non_blocking=True) * 2)
        got_y.append(b.to(DEV, non_blocking=True))
    torch.vnpu.synchronize()
    assert torch.equal(torch.cat(got_x).cpu(), xs * 2)
    assert torch.equal(torch.cat(got_y).cpu(), ys)


def test_nonblocking_pinned_to_device():
    x = torch.randn(1 << 18)
    p = x.pin_memory()
    d = p.to(DEV, non_blocking=True)
    assert d.device == torch.device("vnpu:0")
    torch.vnpu.synchronize()
    assert torch.equal(d.cpu(), x)
    # To the second device too.
    d1 = p.to("vnpu:1", non_blocking=True)
    torch.vnpu.synchronize(1)
    assert torch.equal(d1.cpu(), x)


def test_nonblocking_copy_into_existing_device_tensor_then_compute():
    srcs = [torch.full((1000,), float(i)).pin_memory() for i in range(8)]
    dst = torch.empty(8, 1000, device=DEV)
    for i, s in enumerate(srcs):
        dst[i].copy_(s, non_blocking=True)
    total = dst.sum(1)  # stream-ordered after the copies
    torch.vnpu.synchronize()
    assert torch.equal(total.cpu(), torch.arange(8, dtype=torch.float32) * 1000)


def test_nonblocking_device_to_pinned_host():
    x = torch.randn(1 << 16)
    d = x.to(DEV)
    out = torch.empty_like(x).pin_memory()
    out.copy_(d * 3, non_blocking=True)
    torch.vnpu.synchronize()
    assert torch.equal(out, x * 3)
    # .to("cpu", non_blocking=True) returns a pinned tensor (as from CUDA), valid after synchronize.
    y = (d + 1).to("cpu", non_blocking=True)
    assert y.is_pinned()
    torch.vnpu.synchronize()
    assert torch.equal(y, x + 1)


def test_nonblocking_with_event_on_side_stream():
    x = torch.randn(4096)
    p = x.pin_memory()
    s = torch.vnpu.Stream()
    with torch.vnpu.stream(s):
        d = p.to(DEV, non_blocking=True)
        e = torch.vnpu.Event()
        e.record(s)
    torch.vnpu.current_stream().wait_event(e)
    r = d * 2
    d.record_stream(torch.vnpu.current_stream())
    e.synchronize()
    assert e.query()
    assert torch.equal(r.cpu(), x * 2)


def test_nonblocking_from_pageable_source_can_be_reused_at_once():
    # From pageable memory the copy is staged: the caller may overwrite the source immediately.
    x = torch.randn(1 << 18)
    expected = x.clone()
    d = x.to(DEV, non_blocking=True)
    x.fill_(-1.0)
    torch.vnpu.synchronize()
    assert torch.equal(d.cpu(), expected)
    dst = torch.empty(1 << 18, device=DEV)
    src = expected.clone()
    dst.copy_(src, non_blocking=True)
    src.zero_()
    torch.vnpu.synchronize()
    assert torch.equal(dst.cpu(), expected)


def test_pinned_source_reused_after_synchronize():
    p = torch.arange(1000, dtype=torch.float32).pin_memory()
    outs = []
    for k in range(4):
        p.fill_(float(k))
        outs.append(p.to(DEV, non_blocking=True))
        torch.vnpu.synchronize()
    for k, o in enumerate(outs):
        assert torch.equal(o.cpu(), torch.full((1000,), float(k)))


def test_blocking_copy_from_pinned_source_returns_after_the_copy():
    # As on CUDA, a copy without non_blocking leaves the source free to modify or free at once, even when
    # the stream is busy (regression: the runtime's async pinned-memory copy used to be left pending, so a
    # DataLoader(pin_memory=True) batch could be overwritten before it reached the device).
    a = torch.randn(512, 512, device=DEV)
    for _ in range(5):
        for _ in range(3):
            a = a @ a / 23  # keep the stream busy
        src = torch.arange(4096, dtype=torch.float32).pin_memory()
        ref = src.clone()
        d = src.to(DEV)
        src.fill_(-1)
        del src
        refill = torch.full((4096,), -2.0).pin_memory()  # may reuse the freed pinned block
        assert torch.equal(d.cpu(), ref)
        del refill


def test_host_memory_stats_count_pinned_blocks_as_torch_cuda():
    """torch.vnpu.host_memory_stats: torch.cuda's keys and accounting (sizes rounded up to a power of two;
    a freed block stays allocated in the cache until the cache is emptied)."""
    import gc

    from torch_vnpu import _C

    gc.collect()
    torch.vnpu.synchronize()
    _C._host_empty_cache()
    torch.vnpu.reset_peak_host_memory_stats()
    base = torch.vnpu.host_memory_stats()
    assert {"num_host_alloc", "num_host_free", "allocations.current", "allocated_bytes.peak",
            "active_requests.freed", "active_bytes.allocated", "host_alloc_time.avg",
            "host_free_time.count"} <= set(base)
    assert torch.vnpu.host_memory_stats_as_nested_dict()["allocated_bytes"]["current"] == base[
        "allocated_bytes.current"]

    def delta(key):
        return torch.vnpu.host_memory_stats()[key] - base[key]

    a = torch.empty(10, dtype=torch.uint8, pin_memory=True)
    b = torch.empty(20, dtype=torch.uint8, pin_memory=True)
    assert (delta("allocations.current"), delta("allocated_bytes.current"), delta("num_host_alloc")) == (2, 48, 2)
    assert (delta("active_requests.current"), delta("active_bytes.current")) == (2, 48)
    del a
    gc.collect()
    assert (delta("active_requests.current"), delta("active_bytes.current")) == (1, 32)
    assert delta("allocated_bytes.current") == 48  # cached, still the allocator's
    _C._host_empty_cache()
    assert (delta("allocated_bytes.current"), delta("num_host_free"), delta("allocations.freed")) == (32, 1, 1)
    assert torch.vnpu.host_memory_stats()["allocated_bytes.peak"] >= base["allocated_bytes.current"] + 48
    torch.vnpu.reset_peak_host_memory_stats()
    assert torch.vnpu.host_memory_stats()["allocated_bytes.peak"] == base["allocated_bytes.current"] + 32
    torch.vnpu.reset_accumulated_host_memory_stats()
    s = torch.vnpu.host_memory_stats()
    assert (s["allocations.allocated"], s["allocations.freed"], s["allocated_bytes.current"]) == (
        0, 0, base["allocated_bytes.current"] + 32)
    del b
