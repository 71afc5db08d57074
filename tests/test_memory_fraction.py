"""torch.vnpu.set_per_process_memory_fraction: the caching allocator's limit, as torch.cuda's.

Oracle: torch.cuda's documented behaviour (allowed memory = capacity x fraction; past it, cached memory is
released and then torch.OutOfMemoryError raised; TypeError / ValueError for bad fractions) and the values of
the tensors that stay alive.
"""
import gc
import os
import subprocess
import sys
import textwrap

import pytest
import torch

MiB = 1 << 20


@pytest.fixture(autouse=True)
def _no_limit_after():
    yield
    gc.collect()  # pytest.raises' traceback holds the test's tensors in a cycle: free them now, not in a later test
    for d in range(torch.vnpu.device_count()):
        torch.vnpu.set_per_process_memory_fraction(1.0, d)
    torch.vnpu.empty_cache()


def limit_to(extra_bytes, device=0):
    """Sets the fraction so that `extra_bytes` more than what is reserved now may be reserved."""
    torch.vnpu.synchronize()
    torch.vnpu.empty_cache()
    total = torch.vnpu.mem_get_info(device)[1]
    fraction = (torch.vnpu.memory_reserved(device) + extra_bytes) / total
    torch.vnpu.set_per_process_memory_fraction(fraction, device)
    return fraction


def test_default_and_per_device_values():
    assert torch.vnpu.get_per_process_memory_fraction() == 1.0
    torch.vnpu.set_per_process_memory_fraction(0.5)
    assert torch.vnpu.get_per_process_memory_fraction(0) == 0.5
    if torch.vnpu.device_count() > 1:
        assert torch.vnpu.get_per_process_memory_fraction("vnpu:1") == 1.0
        torch.vnpu.set_per_process_memory_fraction(0.25, torch.device("vnpu", 1))
        assert torch.vnpu.get_per_process_memory_fraction(1) == 0.25
        assert torch.vnpu.get_per_process_memory_fraction(0) == 0.5


def test_bad_fractions_raise_torch_cudas_errors_and_keep_the_limit():
    torch.vnpu.set_per_process_memory_fraction(0.5)
    with pytest.raises(TypeError, match="must be `float`"):
        torch.vnpu.set_per_process_memory_fraction(1)
    for bad in (1.5, -0.1):
        with pytest.raises(ValueError, match="Allowed range: 0~1"):
            torch.vnpu.set_per_process_memory_fraction(bad)
    with pytest.raises(RuntimeError, match="Invalid device ordinal"):
        torch.vnpu.set_per_process_memory_fraction(0.5, 99)
    assert torch.vnpu.get_per_process_memory_fraction() == 0.5


def test_past_the_limit_raises_out_of_memory_and_loses_nothing():
    keep = torch.arange(1000, dtype=torch.float32, device="vnpu")
    limit_to(40 * MiB)
    a = torch.ones(24 * MiB // 4, device="vnpu")  # fits
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(24 * MiB // 4, device="vnpu")  # 48 MiB > 40 MiB
    text = str(info.value)
    assert "allowed;" in text and "set_per_process_memory_fraction(" in text and "raise the fraction" in text
    assert torch.equal(keep.cpu(), torch.arange(1000, dtype=torch.float32))
    assert a.sum().item() == 24 * MiB // 4
    del a
    b = torch.full((24 * MiB // 4,), 2.0, device="vnpu")  # the freed memory is within the limit again
    assert b.sum().item() == 2.0 * (24 * MiB // 4)
    torch.vnpu.set_per_process_memory_fraction(1.0)
    c = torch.ones(24 * MiB // 4, device="vnpu")  # raising the fraction lifts the limit
    assert c.sum().item() == 24 * MiB // 4


def test_cached_blocks_are_released_before_the_limit_raises():
    limit_to(40 * MiB)
    small = [torch.empty(6 * MiB // 4, device="vnpu") for _ in range(5)]  # 30 MiB in cached-size blocks
    del small  # cached, not returned: 30 MiB of the 40 stay reserved
    big = torch.ones(32 * MiB // 4, device="vnpu")  # needs the cache released first, as on CUDA
    assert big.sum().item() == 32 * MiB // 4
    assert torch.vnpu.memory_stats()["num_alloc_retries"] >= 1


def test_only_the_limited_device_is_limited():
    if torch.vnpu.device_count() < 2:
        pytest.skip("needs 2 vnpu devices")
    limit_to(8 * MiB, device=0)
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(16 * MiB // 4, device="vnpu:0")
    x = torch.ones(16 * MiB // 4, device="vnpu:1")
    assert x.sum().item() == 16 * MiB // 4


def test_expandable_segments_respect_the_limit(tmp_path):
    code = textwrap.dedent("""
        import torch
        MiB = 1 << 20
        total = torch.vnpu.mem_get_info()[1]
        torch.vnpu.set_per_process_memory_fraction(40 * MiB / total)
        a = torch.ones(24 * MiB // 4, device="vnpu")
        try:
            torch.empty(24 * MiB // 4, device="vnpu")
            print("no error")
        except torch.OutOfMemoryError as e:
            print("OOM", "allowed" in str(e))
        del a
        b = torch.ones(24 * MiB // 4, device="vnpu")
        print("sum", int(b.sum().item()), torch.vnpu.memory_reserved() <= 40 * MiB)
    """)
    env = dict(os.environ, PYTORCH_VNPU_ALLOC_CONF="expandable_segments:True")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines[-2:] == ["OOM True", f"sum {24 * MiB // 4} True"], out.stdout
