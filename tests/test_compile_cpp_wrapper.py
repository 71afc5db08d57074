"""torch.compile on vnpu with Inductor's C++ wrapper (``torch._inductor.config.cpp_wrapper = True``, issue #9).

The same execution model as the Python wrapper must hold (test_compile.py): buffers from the caching allocator,
extern kernels as vnpu ops and fused kernels on the current stream, asynchronous, errors sticky at the next sync.
Oracle: eager CPU on the same inputs (float32 within 1e-4 relative: fused kernels may reorder float sums).
"""
import copy
import os
import re
import subprocess
import sys

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor import config as inductor_config
from torch._inductor.utils import run_and_get_code

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from compile_models import MLP, ConvBN, Attention  # noqa: E402

TOL = dict(rtol=1e-4, atol=1e-5)


@pytest.fixture(autouse=True)
def _cpp_wrapper():
    torch._dynamo.reset()
    counters.clear()
    with inductor_config.patch(cpp_wrapper=True):
        yield
    torch._dynamo.reset()


def _cpp_source(code):
    """The C++ source of a generated C++ wrapper module."""
    return code[code.index('cpp_wrapper_src = (') : code.index('inductor_entry = ')]


def _check_vnpu_wrapper(codes):
    """Every graph is a vnpu C++ wrapper: kernels launched on the stream, no CPU shim or CPU device."""
    assert codes
    for code in codes:
        src = _cpp_source(code)
        assert "inductor_entry_impl" in src and "VnpuCppWrapperCodeCache" in code
        # (vnpu's runtime header defines aoti_torch_vnpu_view_dtype as `return aoti_torch_cpu_view_dtype(...)`)
        assert not re.search(r"(?<!return )aoti_torch_cpu_|cached_torch_device_type_cpu", src), src
    assert any("torch_vnpu_cpp_wrapper::launch(" in _cpp_source(code) for code in codes)


def _train_step_parity(make, x):
    torch.manual_seed(0)
    ref = make()
    mod = copy.deepcopy(ref).to("vnpu")
    compiled = torch.compile(mod)

    def step():
        out = compiled(x.to("vnpu"))
        out.square().mean().backward()
        return out

    out, codes = run_and_get_code(step)
    ref_out = ref(x)
    ref_out.square().mean().backward()
    torch.testing.assert_close(out.cpu(), ref_out, **TOL)
    for (name, p), q in zip(mod.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, **TOL, msg=lambda m: f"{name}: {m}")
    for b, c in zip(mod.buffers(), ref.buffers()):  # batch norm running statistics
        torch.testing.assert_close(b.cpu(), c, **TOL)
    _check_vnpu_wrapper(codes)
    assert len(codes) == 2  # forward and backward graphs
    return codes


def test_mlp_forward_backward_matches_eager_cpu():
    codes = _train_step_parity(MLP, torch.randn(4, 16))
    # the mm/addmm are dispatched vnpu ops, not CPU's shims
    assert any("addmm" in _cpp_source(c) or '"aten::mm"' in _cpp_source(c) for c in codes)


# slow: a cold C++-wrapper compile (~39 s); conv + batch norm is in the default run through AOTInductor's
# package (test_compile_aoti.py) and the Python wrapper's parity tests.
@pytest.mark.slow
def test_conv_batch_norm_forward_backward_matches_eager_cpu():
    _train_step_parity(ConvBN, torch.randn(2, 3, 8, 8))


def test_sdpa_attention_forward_backward_matches_eager_cpu():
    _train_step_parity(Attention, torch.randn(2, 8, 32))


# ---------------------------------------------------------------------------------------------------------
# Execution model


def _relu_sum(a, b):
    return torch.relu(a @ b).sum(dim=1)


def test_stream_order_with_eager_ops_on_a_side_stream_and_events():
    # The extern mm and the fused relu+sum that reads its output both go to the side stream, between eager ops.
    torch.manual_seed(0)
    a = torch.randn(512, 512)
    ref = (torch.relu(((a * 1.0) @ a).double() @ a.double()).sum(dim=1) + 1) * 2
    f = torch.compile(_relu_sum)
    av = a.to("vnpu")
    _, codes = run_and_get_code(f, av, av)
    _check_vnpu_wrapper(codes)
    side = torch.vnpu.Stream()
    results = []
    for _ in range(5):
        x = av * 1.0
        ready = torch.vnpu.Event()
        ready.record()
        with torch.vnpu.stream(side):
            side.wait_event(ready)
            y = x @ av
            z = f(y, av)
            w = (z + 1) * 2
            done = side.record_event()
            x.record_stream(side)
        torch.vnpu.current_stream().wait_event(done)
        results.append(w.cpu())
    for r in results:
        torch.testing.assert_close(r.double(), ref, rtol=1e-3, atol=1e-2)


# slow: a cold C++-wrapper compile (~32 s); AOTInductor's test of the same (asynchronous call, caching-allocator
# buffers) through the same C++ wrapper code is in the default run.
@pytest.mark.slow
def test_compiled_call_is_asynchronous_and_allocates_from_the_caching_allocator():
    f = torch.compile(_relu_sum)
    a = torch.randn(1024, 1024, device="vnpu")
    f(a, a)
    torch.vnpu.synchronize()
    before = torch.vnpu.memory_stats()["allocation.all.allocated"]
    x = a
    for _ in range(4):  # ~0.1-1 s of queued work
        x = x @ a
    out = f(x, a)
    assert not torch.vnpu.current_stream().query()  # the call enqueued its kernels and returned
    torch.vnpu.synchronize()
    assert torch.vnpu.memory_stats()["allocation.all.allocated"] - before >= 6  # 4 eager + mm buffer + output
    torch.testing.assert_close(out.cpu(), _relu_sum(x.cpu(), a.cpu()), rtol=1e-3, atol=1e-1)


def test_cpu_scalar_argument_is_taken_by_value_at_launch():
    f = torch.compile(lambda x, s: torch.relu(x) * s)
    a = torch.randn(256, 256, device="vnpu")
    s = torch.tensor(0.0)
    outs = []
    for i in range(4):
        y = a @ a
        s.fill_(float(i))
        outs.append(f(y, s))
    ref = torch.relu(a.cpu() @ a.cpu())
    for i, o in enumerate(outs):
        torch.testing.assert_close(o.cpu(), ref * i, rtol=1e-4, atol=1e-3)


# slow: two cold C++-wrapper compiles (~60 s quiet); dynamic shapes are in the default run through the Python
# wrapper (test_compile_dynamic.py) and AOTInductor's dynamic batch (test_compile_aoti.py).
@pytest.mark.slow
def test_two_lengths_compile_at_most_twice():
    mod = MLP()
    f = torch.compile(copy.deepcopy(mod).to("vnpu"))
    for n in (5, 9, 13):
        x = torch.randn(n, 16)
        with torch.no_grad():
            torch.testing.assert_close(f(x.to("vnpu")).cpu(), mod(x), **TOL)
    assert counters["stats"]["unique_graphs"] <= 2  # static first, then one graph with a symbolic length


# slow: one more cold C++-wrapper compile; the Python wrapper's second-device test is in the default run.
@pytest.mark.slow
def test_second_device_uses_its_own_stream():
    if torch.vnpu.device_count() < 2:
        pytest.skip("needs 2 vnpu devices")
    x = torch.randn(64, 64)
    f = torch.compile(lambda t: (t @ t).relu().sum(0))
    with torch.vnpu.device(0):
        out = f(x.to("vnpu:1"))
        assert torch.vnpu.current_device() == 0  # the graph's device guard restored it
    assert out.device == torch.device("vnpu:1")
    torch.testing.assert_close(out.cpu(), (x @ x).relu().sum(0), rtol=1e-4, atol=1e-3)


# ---------------------------------------------------------------------------------------------------------
# Errors


def _floordiv(a, b):
    return a // b + 1


def test_kernel_error_is_sticky_names_the_kernel_and_graph_and_device_stays_usable():
    f = torch.compile(_floordiv)
    a, b = torch.arange(8), torch.tensor([1, 2, 0, 1, 1, 1, 1, 1])
    out = f(a.to("vnpu"), b.to("vnpu"))  # enqueued: no error yet
    with pytest.raises(torch.AcceleratorError, match=r"kernel 'cpp_fused_\w+ \(compiled graph [^)]*\)' failed on vnpu:0.*"
                                                     r"ZeroDivisionError"):
        torch.vnpu.synchronize()
    del out
    torch.vnpu.synchronize()  # reported once
    torch.testing.assert_close(f(a.to("vnpu"), b.clamp_min(1).to("vnpu")).cpu(), a // b.clamp_min(1) + 1)


def test_launch_blocking_raises_at_the_compiled_call():
    code = (
        "import torch\n"
        "torch._inductor.config.cpp_wrapper = True\n"
        "f = torch.compile(lambda a, b: a // b + 1)\n"
        "a, b = torch.arange(8, device='vnpu'), torch.tensor([1, 2, 0, 1, 1, 1, 1, 1], device='vnpu')\n"
        "try:\n"
        "    f(a, b)\n"
        "    print('returned')\n"
        "except torch.AcceleratorError as e:\n"
        "    print('raised at the call:', 'ZeroDivisionError' in str(e))\n"
        "print('usable:', f(a, b.clamp_min(1)).tolist())\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=HERE, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "VNPU_LAUNCH_BLOCKING": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[:2] == ["raised at the call: True", "usable: [1, 1, 3, 4, 5, 6, 7, 8]"]


def test_dtype_view_of_a_buffer_or_input_reinterprets_the_bits():
    # A dtype view of a realized buffer (an extern mm's output) or of a graph input is a reinterpret call in the
    # C++ wrapper (aoti_torch_<device>_view_dtype), not a kernel.
    f = torch.compile(lambda a, b: ((a @ b).view(torch.int32), a.view(torch.int32), (a * 2).sum(0)))
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    (mm, view, _), codes = run_and_get_code(f, a.to("vnpu"), b.to("vnpu"))
    _check_vnpu_wrapper(codes)
    assert any("aoti_torch_vnpu_view_dtype" in _cpp_source(code) for code in codes)
    assert (mm.dtype, view.dtype, mm.device.type, view.device.type) == (torch.int32, torch.int32, "vnpu", "vnpu")
    torch.testing.assert_close(mm.cpu(), (a @ b).view(torch.int32), rtol=0, atol=0)
    torch.testing.assert_close(view.cpu(), a.view(torch.int32), rtol=0, atol=0)


def test_reduce_overhead_records_the_cpp_wrapper_graph(monkeypatch):
    # Inductor records C++-wrapper graphs only without graph partitioning (torch 2.13's rule, as on CUDA).
    replays = []
    replay = torch.vnpu.VNPUGraph.replay
    monkeypatch.setattr(torch.vnpu.VNPUGraph, "replay", lambda g: (replays.append(g), replay(g))[1])
    torch.manual_seed(0)
    ref = MLP().eval()
    mod = copy.deepcopy(ref).to("vnpu")
    x = torch.randn(4, 16)
    with inductor_config.patch(graph_partition=False), torch.no_grad():
        compiled = torch.compile(mod, mode="reduce-overhead")
        (outs, codes) = run_and_get_code(lambda: [compiled(x.to("vnpu")).clone() for _ in range(4)])
        expected = ref(x)
    for out in outs:
        torch.testing.assert_close(out.cpu(), expected, **TOL)
    _check_vnpu_wrapper(codes)
    assert len(replays) == 3 and counters["inductor"]["cudagraph_skips"] == 0
