"""torch.vnpu.memory.VNPUPluggableAllocator / change_current_allocator / caching_allocator_enable, with
torch.cuda.memory's semantics (CUDAPluggableAllocator, change_current_allocator, caching_allocator_enable).
The allocator is a real shared library built here, allocating with the runtime's vnpuMalloc."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import torch_vnpu

ROOT = pathlib.Path(__file__).resolve().parent.parent

SOURCE = r"""
#include <vnpu/runtime.h>
#include <atomic>
#include <cstddef>
static std::atomic<long> allocs{0}, frees{0}, bytes_live{0};
extern "C" void* my_alloc(size_t size, int device, vnpuStream_t stream) {
  int prev = 0;
  vnpuGetDevice(&prev);
  vnpuSetDevice(device);
  void* p = nullptr;
  vnpuError_t e = vnpuMalloc(&p, size);
  vnpuSetDevice(prev);
  if (e != vnpuSuccess) return nullptr;
  allocs++; bytes_live += (long)size;
  return p;
}
extern "C" void my_free(void* ptr, size_t size, int device, vnpuStream_t stream) {
  frees++; bytes_live -= (long)size;
  vnpuFree(ptr);  // waits for the device's queued work: never freed under a running kernel
}
extern "C" long stat(int which) { return which == 0 ? allocs.load() : which == 1 ? frees.load() : bytes_live.load(); }
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    d = tmp_path_factory.mktemp("alloc")
    (d / "alloc.cpp").write_text(SOURCE)
    lib = pathlib.Path(torch_vnpu.__file__).parent / "lib"
    subprocess.run(["c++", "-std=c++17", "-shared", "-fPIC", "-O1", str(d / "alloc.cpp"), "-o", str(d / "alloc.so"),
                    f"-I{ROOT / 'csrc' / 'runtime' / 'include'}", f"-L{lib}", "-lvnpu_runtime",
                    f"-Wl,-rpath,{lib}"], check=True, timeout=120)
    return str(d / "alloc.so")


CHILD = r"""
import ctypes, json, sys
import torch
so = sys.argv[1]
alloc = torch.vnpu.memory.VNPUPluggableAllocator(so, "my_alloc", "my_free")
torch.vnpu.memory.change_current_allocator(alloc)
stat = ctypes.CDLL(so).stat
stat.restype = ctypes.c_long
out = {}
torch.manual_seed(0)
a, b = torch.randn(64, 32), torch.randn(32, 16)
x, y = a.to("vnpu"), b.to("vnpu:1")
out["allocs_after_upload"] = stat(0)
out["matmul_equal"] = torch.equal((x @ y.to("vnpu")).cpu(), a @ b)
loss = (x.requires_grad_() @ b.to("vnpu")).square().sum()
loss.backward()
out["grad_equal"] = torch.allclose(x.grad.cpu(), 2 * (a @ b) @ b.t(), rtol=1e-5, atol=1e-5)
for name, fn in (("memory_allocated", torch.vnpu.memory_allocated), ("memory_snapshot", torch.vnpu.memory_snapshot)):
    try:
        fn()
        out[name] = "no error"
    except RuntimeError as e:
        out[name] = str(e)
free, total = torch.vnpu.mem_get_info()
out["mem_get_info"] = 0 < free <= total and torch.accelerator.get_memory_info()[1] == total
out["list_gpu_processes"] = torch.vnpu.list_gpu_processes().splitlines()[0]
torch.vnpu.empty_cache()
del x, y, loss
torch.vnpu.synchronize()
import gc; gc.collect()
out["live_bytes_after_free"] = stat(2) - 0
out["frees"] = stat(1)
out["allocs"] = stat(0)
print(json.dumps(out))
"""


def test_a_pluggable_allocator_serves_every_allocation(library, tmp_path):
    proc = subprocess.run([sys.executable, "-c", CHILD, library], capture_output=True, text=True, timeout=300,
                          cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["allocs_after_upload"] >= 2  # x on vnpu:0 and y on vnpu:1 both from my_alloc
    assert got["matmul_equal"] and got["grad_equal"], got
    for name in ("memory_allocated", "memory_snapshot"):
        assert "does not support" in got[name] and "change_current_allocator" in got[name], got[name]
    assert got["mem_get_info"] and got["list_gpu_processes"] == "GPU:0"  # the device answers, as on CUDA
    assert got["frees"] > 0 and got["frees"] <= got["allocs"]
    # what is still alive is only what the process still holds (x.grad, a's leaf copies...): freed ones returned
    assert got["live_bytes_after_free"] < 64 * 32 * 4 * 4, got


def test_swapping_after_the_device_was_used_raises(library, tmp_path):
    code = ("import sys, torch\ntorch.ones(1, device='vnpu')\n"
            "a = torch.vnpu.memory.VNPUPluggableAllocator(sys.argv[1], 'my_alloc', 'my_free')\n"
            "try:\n    torch.vnpu.memory.change_current_allocator(a)\nexcept RuntimeError as e:\n    print(e)\n"
            "t = torch.ones(2, device='vnpu')\nprint(t.sum().item(), torch.vnpu.memory_allocated() > 0)\n")
    proc = subprocess.run([sys.executable, "-c", code, library], capture_output=True, text=True, timeout=300,
                          cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("Can't swap an already initialized allocator"), lines
    assert lines[-1] == "2.0 True"  # the caching allocator goes on


def test_missing_library_or_function_raises(library):
    with pytest.raises(OSError):
        torch.vnpu.memory.VNPUPluggableAllocator("/nonexistent/alloc.so", "my_alloc", "my_free")
    with pytest.raises(AttributeError):
        torch.vnpu.memory.VNPUPluggableAllocator(library, "no_such_alloc", "my_free")


def test_caching_allocator_enable_false_allocates_and_frees_each_time():
    torch.vnpu.synchronize()
    torch.vnpu.empty_cache()
    reserved_before = torch.vnpu.memory_reserved()
    free_before = torch.vnpu.mem_get_info()[0]
    torch.vnpu.memory.caching_allocator_enable(False)
    try:
        a = torch.randn(1 << 20, device="vnpu")  # 4 MiB outside the cache
        torch.vnpu._sleep(50_000_000)  # the stream is busy when a dies
        b = (a * 2).sum()
        assert torch.vnpu.memory_reserved() == reserved_before  # not the caching allocator's
        assert torch.vnpu.mem_get_info()[0] <= free_before - (4 << 20)
        expected = (a.cpu() * 2).sum()
        del a  # vnpuFree waits for the queued multiply: the value below stays right
        torch.testing.assert_close(b.cpu(), expected)
        assert torch.vnpu.mem_get_info()[0] >= free_before - (1 << 20)  # returned at once, not cached
    finally:
        torch.vnpu.memory.caching_allocator_enable(True)
    c = torch.ones(3, device="vnpu")
    assert torch.vnpu.memory_allocated() > 0 and c.sum().item() == 3.0


def test_a_cuda_script_with_a_pluggable_allocator_runs_in_port_mode(library, tmp_path):
    script = tmp_path / "s.py"
    script.write_text(
        "import ctypes, sys, torch\n"
        "a = torch.cuda.memory.CUDAPluggableAllocator(sys.argv[1], 'my_alloc', 'my_free')\n"
        "torch.cuda.memory.change_current_allocator(a)\n"
        "x = torch.arange(6.0, device='cuda')\n"
        "stat = ctypes.CDLL(sys.argv[1]).stat\n"
        "print(x.device, (x * 2).sum().item(), stat(0) >= 1)\n")
    proc = subprocess.run([sys.executable, "-m", "torch_vnpu.port.run", str(script), library], capture_output=True,
                          text=True, timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "vnpu:0 30.0 True", proc.stdout
