"""torch.vnpu.caching_allocator_alloc / caching_allocator_delete: raw blocks of the caching allocator, as
torch.cuda's (oracle: torch.cuda's documented behaviour and the allocator's own statistics)."""
import gc

import pytest
import torch


@pytest.fixture(autouse=True)
def _collect_after():
    yield
    gc.collect()  # pytest.raises' traceback keeps the test's tensors in a cycle until collected


def test_raw_blocks_are_counted_reused_and_freed():
    torch.vnpu.synchronize()
    before = torch.vnpu.memory_allocated()
    p = torch.vnpu.caching_allocator_alloc(1 << 20)
    assert p != 0 and torch.vnpu.memory_allocated() == before + (1 << 20)
    torch.vnpu.caching_allocator_delete(p)
    assert torch.vnpu.memory_allocated() == before
    q = torch.vnpu.caching_allocator_alloc(1 << 20)  # the cached block comes back
    assert q == p
    torch.vnpu.caching_allocator_delete(q)
    assert torch.vnpu.caching_allocator_alloc(0) == 0


def test_streams_devices_and_bad_arguments():
    s = torch.vnpu.Stream()
    p = torch.vnpu.caching_allocator_alloc(4096, stream=s)
    q = torch.vnpu.caching_allocator_alloc(4096, stream=s.vnpu_stream)
    assert p != q
    torch.vnpu.caching_allocator_delete(p)
    torch.vnpu.caching_allocator_delete(q)
    with pytest.raises(TypeError, match="Invalid type for stream argument"):
        torch.vnpu.caching_allocator_alloc(4096, stream="s")
    with pytest.raises(ValueError, match="is not a stream of vnpu"):
        torch.vnpu.caching_allocator_alloc(4096, stream=12345)
    if torch.vnpu.device_count() > 1:
        with pytest.raises(ValueError, match="is not a stream of vnpu:1"):
            torch.vnpu.caching_allocator_alloc(4096, device=1, stream=s)
        r = torch.vnpu.caching_allocator_alloc(4096, device=1)
        assert torch.vnpu.memory_allocated(1) >= 4096
        torch.vnpu.caching_allocator_delete(r)
    x = torch.ones(8, device="vnpu")
    with pytest.raises(RuntimeError, match="invalid device pointer"):
        torch.vnpu.caching_allocator_delete(x.data_ptr() + 4)  # inside a block, not a raw block's start
    with pytest.raises(RuntimeError, match="invalid device pointer"):
        torch.vnpu.caching_allocator_delete(12345)
    with pytest.raises(RuntimeError, match="invalid device pointer"):
        torch.vnpu.caching_allocator_delete(x.data_ptr())  # a tensor's own block is not the caller's to free
    y = torch.zeros(8, device="vnpu")  # would have taken x's block
    assert x.sum().item() == 8.0 and y.sum().item() == 0.0  # nothing lost
    r = torch.vnpu.caching_allocator_alloc(64)
    torch.vnpu.caching_allocator_delete(r)
    with pytest.raises(RuntimeError, match="invalid device pointer"):
        torch.vnpu.caching_allocator_delete(r)  # twice


def test_a_raw_block_past_the_memory_limit_raises_out_of_memory():
    total = torch.vnpu.mem_get_info()[1]
    try:
        torch.vnpu.set_per_process_memory_fraction((torch.vnpu.memory_reserved() + (8 << 20)) / total)
        with pytest.raises(torch.OutOfMemoryError):
            torch.vnpu.caching_allocator_alloc(64 << 20)
    finally:
        torch.vnpu.set_per_process_memory_fraction(1.0)
