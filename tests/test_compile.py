"""torch.compile on vnpu (issue #9): registration, the stream execution model, errors, modes, graph breaks.

Oracle: eager CPU on the same inputs. Parity of whole modules and training features is in
test_compile_parity.py, dynamic shapes in test_compile_dynamic.py.
"""
import copy
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn as nn
from torch._inductor.utils import run_and_get_code

HERE = os.path.dirname(os.path.abspath(__file__))


def _run_python(code, **env):
    """Runs ``code`` in a fresh interpreter (outside the source tree); returns stdout."""
    r = subprocess.run([sys.executable, "-c", code], cwd=HERE, capture_output=True, text=True, timeout=600,
                       env={**os.environ, **env})
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


# ---------------------------------------------------------------------------------------------------------
# Registration


def test_import_torch_does_not_import_dynamo_or_inductor():
    out = _run_python("import sys, torch; torch.ones(1, device='vnpu');"
                      "print(sorted(m for m in sys.modules if m.startswith(('torch._dynamo', 'torch._inductor'))))")
    assert out.strip() == "[]"


def test_dynamo_interface_and_inductor_backend_registered_on_first_use():
    from torch._dynamo.device_interface import get_interface_for_device
    from torch._inductor.codegen.common import get_device_op_overrides, get_scheduling_for_device, init_backend_registration

    from torch_vnpu._inductor.device_interface import VnpuInterface
    from torch_vnpu._inductor.scheduling import VnpuScheduling

    init_backend_registration()
    iface = get_interface_for_device("vnpu")
    assert iface is VnpuInterface and get_interface_for_device("vnpu:1") is VnpuInterface
    assert issubclass(iface.Stream, torch.Stream) and issubclass(iface.Event, torch.Event)
    assert iface.device_count() == torch.vnpu.device_count() and iface.is_available()
    assert iface.current_stream() == torch.vnpu.current_stream()
    assert iface.get_compute_capability() == 10 * torch.vnpu.get_device_capability()[0] + \
        torch.vnpu.get_device_capability()[1]
    assert iface.Worker.get_device_properties("vnpu:0").total_memory == torch.vnpu.get_device_properties(0).total_memory
    assert get_scheduling_for_device("vnpu") is VnpuScheduling
    assert get_device_op_overrides("vnpu").synchronize() == "torch.vnpu.synchronize()"


def test_registration_is_idempotent():
    import torch_vnpu._inductor as ind
    from torch._inductor.codegen import common
    from torch._inductor.utils import get_current_backend

    before = dict(common.device_codegens)
    ind.register_inductor()
    ind.register_dynamo()
    ind.lazy.install()
    assert common.device_codegens == before
    assert get_current_backend("vnpu") == "cpp" and get_current_backend("cpu") == torch._inductor.config.cpu_backend
    assert not hasattr(common.init_backend_registration._vnpu_original, "_vnpu_original")  # wrapped once


def test_backend_alias_vnpu():
    x = torch.randn(8, 8)
    f = torch.compile(lambda t: torch.relu(t) * 3 + 1, backend="vnpu")
    torch.testing.assert_close(f(x.to("vnpu")).cpu(), torch.relu(x) * 3 + 1)
    from torch._dynamo.backends.registry import list_backends

    assert "vnpu" in list_backends()


# ---------------------------------------------------------------------------------------------------------
# Execution model: stream order, allocator, no host wait


def _relu_sum(a, b):
    return torch.relu(a @ b).sum(dim=1)


def test_fused_kernel_ordered_after_extern_mm_on_the_stream():
    # The mm is an extern kernel queued by the executor; the fused relu+sum reads its output. Run on the host
    # (as CPU's binding would), the fused kernel read buf0 before the mm wrote it: 6 of 10 runs wrong.
    torch.manual_seed(0)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    ref = _relu_sum(a, b)
    f = torch.compile(_relu_sum)
    av, bv = a.to("vnpu"), b.to("vnpu")
    wrong = sum(not torch.allclose(f(av, bv).cpu(), ref, rtol=1e-4, atol=1e-3) for _ in range(10))
    assert wrong == 0


def test_compiled_call_returns_before_its_kernels_ran():
    f = torch.compile(_relu_sum)
    a = torch.randn(1024, 1024, device="vnpu")
    f(a, a)
    torch.vnpu.synchronize()
    x = a
    for _ in range(4):  # ~0.1-1 s of queued work
        x = x @ a
    out = f(x, a)
    assert not torch.vnpu.current_stream().query()  # the call enqueued its kernels and returned
    torch.vnpu.synchronize()
    assert out.device.type == "vnpu"


def test_compiled_graph_between_eager_ops_on_a_side_stream_with_events():
    # On the side stream: an eager mm, then the compiled graph (its extern mm and the fused kernel that reads
    # the mm's output must both go to the side stream), then eager ops; the default stream waits on an event.
    torch.manual_seed(0)
    a = torch.randn(512, 512)
    y_ref = (a * 1.0) @ a
    ref = (torch.relu(y_ref.double() @ a.double()).sum(dim=1) + 1) * 2
    f = torch.compile(_relu_sum)
    av = a.to("vnpu")
    f(av, av)  # compile first
    side = torch.vnpu.Stream()
    results = []
    for _ in range(5):
        x = av * 1.0  # default stream
        ready = torch.vnpu.Event()
        ready.record()
        with torch.vnpu.stream(side):
            side.wait_event(ready)
            y = x @ av  # eager, on the side stream
            z = f(y, av)  # compiled, on the side stream
            w = (z + 1) * 2  # eager again
            done = side.record_event()
            x.record_stream(side)
        torch.vnpu.current_stream().wait_event(done)
        results.append(w.cpu())  # read on the default stream, after the event
    assert torch.vnpu.current_stream() == torch.vnpu.default_stream()
    for r in results:
        torch.testing.assert_close(r.double(), ref, rtol=1e-3, atol=1e-2)


def test_buffers_come_from_the_caching_allocator_and_code_names_no_cpu_device():
    f = torch.compile(lambda x, w: torch.softmax(x @ w, dim=-1).sum(0))
    x, w = torch.randn(64, 32, device="vnpu"), torch.randn(32, 16, device="vnpu")
    torch.vnpu.synchronize()
    before = torch.vnpu.memory_stats()["allocation.all.allocated"]
    out, (code,) = run_and_get_code(f, x, w)
    torch.vnpu.synchronize()
    assert torch.vnpu.memory_stats()["allocation.all.allocated"] - before >= 2  # mm output + result
    body = code[code.index("def call(self, args):"):code.index("runner = Runner(")]
    assert "device='vnpu'" in body
    assert not re.search(r"device='cpu'|type='cpu'|empty_strided_cpu\(|\.cpu\(|\.to\(", body), body
    assert "vnpu_cpp_pybinding" in code
    torch.testing.assert_close(out.cpu(), torch.softmax(x.cpu() @ w.cpu(), dim=-1).sum(0))


def test_cpu_scalar_argument_is_taken_by_value_at_launch():
    # Note [Host scalars in vnpu kernels]: the host changes the CPU scalar while earlier launches still queue.
    f = torch.compile(lambda x, s: torch.relu(x) * s)
    a = torch.randn(512, 512, device="vnpu")
    s = torch.tensor(0.0)
    outs = []
    for i in range(5):
        y = a @ a
        s.fill_(float(i))
        outs.append(f(y, s))
    ref = torch.relu(a.cpu() @ a.cpu())
    for i, o in enumerate(outs):
        torch.testing.assert_close(o.cpu(), ref * i, rtol=1e-4, atol=1e-3)


def test_second_device_uses_its_own_stream():
    if torch.vnpu.device_count() < 2:
        pytest.skip("needs 2 vnpu devices")
    x = torch.randn(100, 100)
    f = torch.compile(lambda t: (t @ t).relu().sum(0))
    with torch.vnpu.device(0):
        out = f(x.to("vnpu:1"))
        assert torch.vnpu.current_device() == 0  # the graph's device guard restored it
    assert out.device == torch.device("vnpu:1")
    torch.testing.assert_close(out.cpu(), (x @ x).relu().sum(0), rtol=1e-4, atol=1e-3)


# ---------------------------------------------------------------------------------------------------------
# Errors


def test_mixed_devices_raise_eagers_error():
    f = torch.compile(lambda a, b: a + b * 2)
    a, b = torch.randn(4, 4, device="vnpu"), torch.randn(4, 4)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device") as eager:
        a + b * 2
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device") as compiled:
        f(a, b)
    assert "vnpu:0 and cpu" in str(eager.value) and "vnpu:0 and cpu" in str(compiled.value)
    if torch.vnpu.device_count() > 1:
        with pytest.raises(RuntimeError, match="vnpu:0 and vnpu:1"):
            f(a, b.to("vnpu:1"))
    torch.testing.assert_close(f(a, b.to("vnpu")).cpu(), a.cpu() + b * 2)  # still usable


def _conv_cases():
    x = torch.randn(2, 4, 6, 7).to(memory_format=torch.channels_last)
    x3 = torch.randn(1, 2, 3, 4, 5).to(memory_format=torch.channels_last_3d)
    w, wt, w3 = torch.randn(5, 4, 3, 3), torch.randn(4, 3, 3, 3), torch.randn(3, 2, 2, 2, 2)

    def conv_and_grads(x, w):
        x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
        y = torch.nn.functional.conv2d(x, w, padding=1)
        return (y, *torch.autograd.grad(y.sum(), (x, w)))

    return [
        (lambda x, w: torch.nn.functional.conv2d(x, w, padding=1), (x, w)),
        (lambda x, w: torch.nn.functional.conv2d(x, w, padding=1), (x.contiguous(), w)),
        (lambda x, w: torch.nn.functional.conv_transpose2d(x, w), (x, wt)),
        (lambda x, w: torch.nn.functional.conv3d(x, w), (x3, w3)),
        (lambda x, w: torch.nn.functional.conv1d(x, w), (torch.randn(2, 3, 9), torch.randn(4, 3, 2))),
        (conv_and_grads, (x, w)),
    ]


def test_fake_convolution_strides_are_vnpus_real_ones():
    # vnpu runs CPU's convolution, whose output follows a channels-last input; the fake (meta) rule that
    # torch.compile / torch.export trace with must say the same (it said contiguous for any non-CPU device).
    from torch._subclasses.fake_tensor import FakeTensorMode

    for f, args in _conv_cases():
        vnpu_args = [a.to("vnpu") for a in args]
        real, cpu = f(*vnpu_args), f(*args)
        with FakeTensorMode() as mode:
            fake = f(*[mode.from_tensor(a) for a in vnpu_args])
        real, cpu, fake = [r if isinstance(r, tuple) else (r,) for r in (real, cpu, fake)]
        for r, c, k in zip(real, cpu, fake):
            assert r.stride() == c.stride() == k.stride() and k.device == r.device


def test_channels_last_conv_graph_matches_eager_cpu():
    # Inductor makes conv graphs channels-last on CPU (and now on vnpu); the extern convolution's real output
    # strides must be the ones the graph was planned with.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), nn.Conv2d(6, 4, 1)).eval()
    x = torch.randn(2, 3, 8, 8)
    ref = model(x)
    vmodel = torch.compile(copy.deepcopy(model).to("vnpu"))
    with torch.no_grad():
        for inp in (x, x.to(memory_format=torch.channels_last)):
            torch.testing.assert_close(vmodel(inp.to("vnpu")).cpu(), ref.detach(), rtol=1e-4, atol=1e-5)


def _floordiv(a, b):
    return a // b + 1


def test_kernel_error_is_sticky_names_the_kernel_and_graph_and_device_stays_usable():
    f = torch.compile(_floordiv)
    a, b = torch.arange(8), torch.tensor([1, 2, 0, 1, 1, 1, 1, 1])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        f(a, b)  # CPU raises at the call
    out = f(a.to("vnpu"), b.to("vnpu"))  # enqueued: no error yet
    with pytest.raises(torch.AcceleratorError, match=r"kernel 'cpp_fused_\w+ \(compiled graph [^)]*\)' failed on vnpu:0.*"
                                                     r"ZeroDivisionError"):
        torch.vnpu.synchronize()
    del out
    torch.vnpu.synchronize()  # reported once
    torch.testing.assert_close(f(a.to("vnpu"), b.clamp_min(1).to("vnpu")).cpu(), a // b.clamp_min(1) + 1)


def test_launch_blocking_raises_at_the_compiled_call():
    out = _run_python(
        "import torch\n"
        "f = torch.compile(lambda a, b: a // b + 1)\n"
        "a, b = torch.arange(8, device='vnpu'), torch.tensor([1, 2, 0, 1, 1, 1, 1, 1], device='vnpu')\n"
        "try:\n"
        "    f(a, b)\n"
        "    print('returned')\n"
        "except torch.AcceleratorError as e:\n"
        "    print('raised at the call:', 'ZeroDivisionError' in str(e))\n",
        VNPU_LAUNCH_BLOCKING="1")
    assert out.strip() == "raised at the call: True"


def test_index_out_of_bounds_in_a_kernel():
    f = torch.compile(lambda x, i: x[i] * 2)
    x, i = torch.randn(100), torch.tensor([1, 2, 500])
    with pytest.raises(RuntimeError, match="index out of bounds"):
        f(x, i)
    f(x.to("vnpu"), i.to("vnpu"))
    with pytest.raises(torch.AcceleratorError, match="index out of bounds"):
        torch.vnpu.synchronize()


def test_unsupported_wrappers_say_what_to_do():
    # (cpp_wrapper=True works: test_compile_cpp_wrapper.py)
    f = torch.compile(lambda t: t.sin() + 1)
    with torch._inductor.config.patch(fx_wrapper=True):
        with pytest.raises(Exception, match="fx_wrapper=True is not supported on vnpu"):
            f(torch.randn(4, device="vnpu"))


# ---------------------------------------------------------------------------------------------------------
# Modes, graph breaks, custom ops


@pytest.mark.parametrize("mode", ["default", "max-autotune", "max-autotune-no-cudagraphs", "reduce-overhead"])
def test_modes(mode, monkeypatch):
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
    x = torch.randn(4, 16)
    ref = m(x)
    m.to("vnpu")
    replays = []
    replay = torch.vnpu.VNPUGraph.replay
    monkeypatch.setattr(torch.vnpu.VNPUGraph, "replay", lambda g: (replays.append(g), replay(g))[1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch._inductor.config.patch(fx_graph_cache=False), torch.no_grad():  # inference: forward graphs only
            f = torch.compile(m, mode=mode)
            outs = [f(x.to("vnpu")) for _ in range(3)]
    for out in outs[-1:]:  # the earlier outputs belong to graphs a later replay overwrote (graph modes)
        torch.testing.assert_close(out.cpu(), ref)
    assert not [w for w in caught if "CUDA graphs" in str(w.message)]
    # CUDA's graph modes replay a recorded graph from the second call on (the first one warms up).
    assert len(replays) == (2 if mode in ("reduce-overhead", "max-autotune") else 0)


def test_fullgraph_graph_break_and_explain():
    def g(x):
        y = x.cos()
        torch._dynamo.graph_break()
        return y + 1

    x = torch.randn(4)
    e = torch._dynamo.explain(g)(x.to("vnpu"))
    assert e.graph_count == 2 and e.graph_break_count == 1
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(g)(x.to("vnpu")).cpu(), x.cos() + 1)
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported):
        torch.compile(g, fullgraph=True)(x.to("vnpu"))


def test_device_count_in_a_compiled_region_does_not_break_the_graph():
    # Found by the compile break test of 2026-12-02: Dynamo could not trace the C++ call behind
    # torch.vnpu.device_count() and broke the graph with "file an issue"; it is a constant of the process.
    def f(x):
        return x * torch.vnpu.device_count() + int(torch.vnpu.is_available())

    x = torch.randn(4)
    torch._dynamo.reset()
    e = torch._dynamo.explain(f)(x.to("vnpu"))
    assert e.graph_count == 1 and e.graph_break_count == 0
    torch._dynamo.reset()
    out = torch.compile(f, fullgraph=True)(x.to("vnpu"))
    torch.testing.assert_close(out.cpu(), x * torch.vnpu.device_count() + 1)


def test_event_recorded_inside_a_compiled_region():
    # Dynamo captures the event; its record is a device-less node, before which the pending C++ kernel must be
    # emitted (it read a buffer the generated code had already deleted: UnboundLocalError).
    def g(x):
        e = torch.vnpu.Event()
        y = torch.relu(x) * 2
        e.record()
        return y + 1, e

    x = torch.randn(64)
    out, e = torch.compile(g)(x.to("vnpu"))
    e.synchronize()
    assert e.query()
    torch.testing.assert_close(out.cpu(), torch.relu(x) * 2 + 1)


@torch.library.custom_op("vnpu_test::scaled_sin", mutates_args=())
def scaled_sin(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.sin(x) * scale  # runs eagerly: on vnpu, through the executor on the stream


@scaled_sin.register_fake
def _(x, scale):
    return torch.empty_like(x)


def test_custom_op_with_fake_impl_inside_a_vnpu_graph():
    f = torch.compile(lambda x: scaled_sin(torch.relu(x) * 2, 0.5) + 1, fullgraph=True)
    x = torch.randn(32)
    out, (code,) = run_and_get_code(f, x.to("vnpu"))
    assert "vnpu_test.scaled_sin" in code and "cpp_fused" in code  # extern op between fused kernels
    torch.testing.assert_close(out.cpu(), torch.sin(torch.relu(x) * 2) * 0.5 + 1)


def test_torch_vnpu_imported_after_inductor_registers_at_once():
    # TORCH_DEVICE_BACKEND_AUTOLOAD=0 and Inductor already used on CPU: importing torch_vnpu then still works.
    out = _run_python(
        "import torch\n"
        "torch.compile(lambda t: t * 2)(torch.ones(2))\n"
        "import torch_vnpu\n"
        "x = torch.randn(4, 4)\n"
        "print(torch.allclose(torch.compile(lambda t: (t @ t).relu() + 1)(x.to('vnpu')).cpu(), (x @ x).relu() + 1))\n",
        TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert out.strip() == "True"
