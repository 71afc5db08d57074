"""Out-of-memory on vnpu: torch.OutOfMemoryError with a CUDA-style message, and the process stays healthy.

The device-capacity scenarios run in a subprocess with VNPU_MEMORY_PER_DEVICE=64M (one process for the
whole module); a few in-process checks use torch.empty against the default capacity (memory is reserved
lazily, so untouched allocations cost no RAM).
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

MiB = 1 << 20

_SCRIPT = textwrap.dedent(r'''
    import json, torch
    MiB = 1 << 20
    r = {}

    def oom(fn):
        try:
            fn()
        except torch.OutOfMemoryError as e:
            return {"type": type(e).__name__, "is_runtime_error": isinstance(e, RuntimeError), "msg": str(e)}
        except Exception as e:  # wrong exception type
            return {"type": type(e).__name__, "is_runtime_error": isinstance(e, RuntimeError), "msg": str(e)}
        return None

    r["capacity"] = torch.vnpu.get_device_properties(0).total_memory
    a = torch.arange(4 * MiB, dtype=torch.float32, device="vnpu")          # 16 MiB, keeps its values
    r["before_alloc"] = torch.vnpu.memory_allocated()
    r["before_reserved"] = torch.vnpu.memory_reserved()
    r["ooms_before"] = torch.vnpu.memory_stats().get("num_ooms")

    # 1. A single request larger than the free capacity.
    r["big"] = oom(lambda: torch.empty(16 * MiB, dtype=torch.float32, device="vnpu"))   # 64 MiB
    # 2. A request larger than the whole capacity.
    r["huge"] = oom(lambda: torch.empty(100 * MiB, dtype=torch.float32, device="vnpu"))  # 400 MiB
    r["ooms_after"] = torch.vnpu.memory_stats().get("num_ooms")
    # No sticky error is left behind.
    try:
        torch.vnpu.synchronize()
        r["sync_after_oom"] = "ok"
    except Exception as e:
        r["sync_after_oom"] = repr(e)
    r["alloc_after_oom"] = torch.vnpu.memory_allocated()

    # 3. Filling the device step by step: the OOM comes when the capacity is used up.
    held = []
    r["fill"] = oom(lambda: [held.append(torch.empty(4 * MiB, dtype=torch.float32, device="vnpu"))
                             for _ in range(100)])
    r["fill_count"] = len(held)
    # 4. An op whose output does not fit.
    r["op"] = oom(lambda: a * 2)
    del held
    # 5. Work continues on the same device after freeing: allocate and compute.
    b = torch.ones(2 * MiB, dtype=torch.float32, device="vnpu")           # 8 MiB (+ 2 x 8 MiB results)
    c = b * 3 + 1
    r["compute_after_free"] = float(c.sum().item())
    r["a_intact"] = bool(torch.equal(a.cpu(), torch.arange(4 * MiB, dtype=torch.float32)))
    del b, c

    # 6. Cached (freed but reserved) blocks are released and the request retried before raising.
    blocks = [torch.empty(4 * MiB, dtype=torch.float32, device="vnpu") for _ in range(3)]   # 3 x 16 MiB
    del blocks
    r["reserved_cached"] = torch.vnpu.memory_reserved()
    try:
        d = torch.zeros(11 * MiB, dtype=torch.float32, device="vnpu")    # 44 MiB: needs the cache released
        r["retry_after_release"] = float(d.sum().item())
        del d
    except Exception as e:
        r["retry_after_release"] = repr(e)

    # 7. The other device is independent of device 0's usage.
    e1 = torch.full((12 * MiB,), 2.0, device="vnpu:1")                      # 48 MiB on vnpu:1
    r["dev1_sum"] = float(e1.sum().item())
    r["dev1_oom"] = oom(lambda: torch.empty(8 * MiB, dtype=torch.float32, device="vnpu:1"))  # +32 MiB
    del e1
    r["a_intact_end"] = bool(torch.equal(a.cpu(), torch.arange(4 * MiB, dtype=torch.float32)))
    torch.vnpu.synchronize()
    print("RESULT" + json.dumps(r))
''')


@pytest.fixture(scope="module")
def run():
    env = dict(os.environ, VNPU_MEMORY_PER_DEVICE="64M")
    env.pop("VNPU_LAUNCH_BLOCKING", None)
    p = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    lines = [line for line in p.stdout.splitlines() if line.startswith("RESULT")]
    assert p.returncode == 0 and lines, f"subprocess failed (rc={p.returncode}):\n{p.stdout}\n{p.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT"):])


def _assert_oom(info):
    assert info is not None, "expected torch.OutOfMemoryError, nothing was raised"
    assert info["type"] == "OutOfMemoryError", info
    assert info["is_runtime_error"]


def test_capacity_from_env(run):
    assert run["capacity"] == 64 * MiB
    assert run["before_alloc"] == 16 * MiB


def test_oom_message_has_request_capacity_allocated_reserved(run):
    info = run["big"]
    _assert_oom(info)
    msg = info["msg"]
    assert "out of memory" in msg.lower()
    assert "Tried to allocate 64.00 MiB" in msg
    assert "total capacity of 64.00 MiB" in msg
    assert "48.00 MiB is free" in msg
    assert "16.00 MiB is allocated" in msg
    assert "reserved" in msg
    assert "vnpu:0" in msg or "vNPU 0" in msg


def test_oom_request_larger_than_capacity(run):
    _assert_oom(run["huge"])
    assert "Tried to allocate 400.00 MiB" in run["huge"]["msg"]
    assert "total capacity of 64.00 MiB" in run["huge"]["msg"]


def test_oom_counted_and_no_sticky_error(run):
    assert run["sync_after_oom"] == "ok"
    assert run["alloc_after_oom"] == run["before_alloc"], "a failed allocation must not leak"
    assert run["ooms_before"] == 0
    assert run["ooms_after"] == 2


def test_oom_when_filling_device(run):
    _assert_oom(run["fill"])
    assert run["fill_count"] == 3           # 16 MiB held + 3 x 16 MiB = 64 MiB
    assert "Tried to allocate 16.00 MiB" in run["fill"]["msg"]
    assert "64.00 MiB is allocated" in run["fill"]["msg"]


def test_oom_in_op_output_allocation(run):
    _assert_oom(run["op"])


def test_work_continues_after_free_and_tensors_intact(run):
    assert run["compute_after_free"] == 4.0 * 2 * MiB
    assert run["a_intact"]
    assert run["a_intact_end"]


def test_cached_blocks_released_before_oom(run):
    assert run["reserved_cached"] >= 64 * MiB - 16 * MiB
    assert run["retry_after_release"] == 0.0


def test_devices_have_separate_capacity(run):
    assert run["dev1_sum"] == 2.0 * 12 * MiB
    _assert_oom(run["dev1_oom"])


# In-process checks against the default capacity: torch.empty reserves lazily, no RAM is touched.

def test_in_process_oom_beyond_capacity_and_recovery():
    cap = torch.vnpu.get_device_properties(0).total_memory
    before = torch.vnpu.memory_allocated()
    with pytest.raises(torch.OutOfMemoryError) as ei:
        torch.empty(cap + MiB, dtype=torch.uint8, device="vnpu")
    msg = str(ei.value)
    assert "Tried to allocate" in msg and "total capacity" in msg
    assert torch.vnpu.memory_allocated() == before
    torch.vnpu.synchronize()
    x = torch.arange(10, device="vnpu")
    assert torch.equal((x * 2).cpu(), torch.arange(10) * 2)


def test_in_process_two_large_empties_exceed_capacity():
    cap = torch.vnpu.get_device_properties(1).total_memory
    keep = torch.ones(5, device="vnpu:1")
    big = torch.empty(cap * 3 // 4, dtype=torch.uint8, device="vnpu:1")
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(cap // 2, dtype=torch.uint8, device="vnpu:1")
    del big
    torch.vnpu.empty_cache()
    again = torch.empty(cap // 2, dtype=torch.uint8, device="vnpu:1")
    assert again.numel() == cap // 2
    del again
    torch.vnpu.empty_cache()
    assert torch.equal(keep.cpu(), torch.ones(5))
