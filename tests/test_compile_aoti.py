"""AOTInductor on vnpu (issue #9): ``aoti_compile_and_package`` of an exported vnpu model, ``aoti_load_package``.

A loaded package has the C++ wrapper's execution model (test_compile_cpp_wrapper.py): buffers from the caching
allocator, extern kernels as vnpu ops (through AOTInductor's proxy executor and the dispatcher), fused kernels on
the current stream, asynchronous. Oracle: eager CPU on the same inputs and weights (float32 within 1e-5).
Three packages are compiled once per module (an MLP with a dynamic batch, a conv + batch norm model, a pointwise
model). An input on the wrong device raises eager's device mismatch before the model runs (vnpu's runner checks
every input's device: Note [Input devices of a vnpu AOTInductor model] in csrc/inductor/AotiRunner.cpp);
AOTI_RUNTIME_CHECK_INPUTS=1 adds AOTInductor's own dtype/shape/stride checks.
"""
import copy
import ctypes
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from compile_models import ConvBN  # noqa: E402

TOL = dict(rtol=1e-5, atol=1e-5)


class MLP(nn.Module):
    """An MLP with two ATen fallbacks: ``topk`` (through AOTInductor's proxy executor) and ``randperm`` with a
    device argument (a boxed dispatcher call on vnpu: the proxy executor would make it on the CPU)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))

    def forward(self, x):
        y = self.net(x)
        return y, y.topk(3, dim=1).values, torch.randperm(x.shape[0], device=x.device)


def _package(model, example, path, dynamic_shapes=None):
    ep = torch.export.export(model, (example,), dynamic_shapes=dynamic_shapes)
    return torch._inductor.aoti_compile_and_package(ep, package_path=str(path))


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """(CPU model, package path, loaded package) of the MLP, exported with a dynamic batch size."""
    torch.manual_seed(0)
    cpu = MLP().eval()
    batch = torch.export.Dim("batch", min=2, max=64)
    path = _package(cpu.to("vnpu"), torch.randn(4, 16, device="vnpu"),
                    tmp_path_factory.mktemp("aoti") / "mlp.pt2", dynamic_shapes={"x": {0: batch}})
    cpu.to("cpu")
    return cpu, path, torch._inductor.aoti_load_package(path)


@pytest.fixture(scope="module")
def convbn(tmp_path_factory):
    torch.manual_seed(1)
    cpu = ConvBN()
    with torch.no_grad():  # non-trivial running statistics
        cpu.bn.running_mean.uniform_(-0.5, 0.5)
        cpu.bn.running_var.uniform_(0.5, 2.0)
    cpu.eval()
    path = _package(cpu.to("vnpu"), torch.randn(2, 3, 8, 8, device="vnpu"),
                    tmp_path_factory.mktemp("aoti") / "convbn.pt2")
    cpu.to("cpu")
    return cpu, path, torch._inductor.aoti_load_package(path)


class Pointwise(nn.Module):
    """Its input's first reader is a fused kernel (the MLP's is addmm, an extern kernel: a dispatcher call, which
    checks devices as eager does)."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 2.0, 64))

    def forward(self, x):
        return (x * self.scale).sin() + 1


@pytest.fixture(scope="module")
def pointwise(tmp_path_factory):
    cpu = Pointwise().eval()
    path = _package(cpu.to("vnpu"), torch.randn(64, device="vnpu"), tmp_path_factory.mktemp("aoti") / "pw.pt2")
    cpu.to("cpu")
    return cpu, path, torch._inductor.aoti_load_package(path)


def _late(device):
    """A zero on ``device`` produced behind ~0.1-1 s of queued work on its current stream."""
    a = torch.randn(1024, 1024, device=device)
    return (a @ a @ a).sum() * 0


def test_mlp_package_matches_eager_cpu_for_two_batch_sizes(mlp):
    cpu, _, package = mlp
    torch.vnpu.reset_op_stats()
    for n in (4, 13):  # one package, dynamic batch
        x = torch.randn(n, 16)
        torch.manual_seed(n)
        out, top, perm = package(x.to("vnpu"))
        torch.manual_seed(n)
        ref_perm = torch.randperm(n, device="vnpu")  # eager vnpu, same generator state
        assert out.device == top.device == perm.device == torch.device("vnpu:0")
        assert out.shape == (n, 8) and top.shape == (n, 3) and perm.dtype == torch.int64
        with torch.no_grad():
            ref, ref_top, _ = cpu(x)
        torch.testing.assert_close(out.cpu(), ref, **TOL)
        torch.testing.assert_close(top.cpu(), ref_top, **TOL)
        assert torch.equal(perm.cpu(), ref_perm.cpu()), (perm, ref_perm)
    # The extern kernels (boxed dispatcher calls) and the fallbacks (topk through the proxy executor, randperm
    # boxed) ran as vnpu ops.
    ops = torch.vnpu.get_executed_ops()
    assert ops.get("aten::addmm.out", 0) >= 4 and ops.get("aten::topk", 0) == 2, ops
    assert sum(n for op, n in ops.items() if op.startswith("aten::randperm")) >= 2, ops


def test_conv_bn_package_matches_eager_cpu(convbn):
    cpu, _, package = convbn
    x = torch.randn(2, 3, 8, 8)
    out = package(x.to("vnpu"))
    assert out.device.type == "vnpu"
    with torch.no_grad():
        torch.testing.assert_close(out.cpu(), cpu(x), **TOL)


def test_call_is_asynchronous_and_allocates_from_the_caching_allocator(mlp):
    cpu, _, package = mlp
    a = torch.randn(1024, 1024, device="vnpu")
    x = torch.randn(32, 16)
    xv = x.to("vnpu")
    package(xv)
    torch.vnpu.synchronize()
    before = torch.vnpu.memory_stats()["allocation.all.allocated"]
    y = a
    for _ in range(4):  # ~0.1-1 s of queued work
        y = y @ a
    out = package(xv)[0]
    assert not torch.vnpu.current_stream().query()  # the call enqueued its kernels and returned
    torch.vnpu.synchronize()
    assert torch.vnpu.memory_stats()["allocation.all.allocated"] - before >= 5  # 4 eager + the graph's buffers
    with torch.no_grad():
        torch.testing.assert_close(out.cpu(), cpu(x)[0], **TOL)


def test_stream_order_on_a_side_stream_with_events(mlp):
    # The package's input is produced by a long eager matmul on the side stream: its kernels must be queued
    # behind it on that stream (read too early, the input block holds stale data).
    cpu, _, package = mlp
    torch.manual_seed(2)
    x, w = torch.randn(48, 512), torch.randn(512, 512) / 24
    with torch.no_grad():
        ref = cpu((x @ w)[:, :16])[0] * 2
    xv, wv = x.to("vnpu"), w.to("vnpu")
    side = torch.vnpu.Stream()
    results = []
    for _ in range(5):
        ready = torch.vnpu.Event()
        ready.record()
        with torch.vnpu.stream(side):
            side.wait_event(ready)
            y = (xv @ wv @ torch.eye(512, device="vnpu"))[:, :16]
            z = package(y.contiguous())[0] * 2
            done = side.record_event()
        torch.vnpu.current_stream().wait_event(done)
        z.record_stream(torch.vnpu.current_stream())
        results.append(z.cpu())
    for r in results:
        torch.testing.assert_close(r, ref, rtol=1e-4, atol=1e-4)


def _with_weights(cpu, weights):
    """A copy of the CPU model with ``weights`` (CPU tensors by FQN) replacing its own."""
    model = copy.deepcopy(cpu)
    with torch.no_grad():
        for name, value in weights.items():
            model.get_parameter(name).copy_(value)
    return model


def test_weights_replaced_after_loading(mlp):
    # load_constants on vnpu, as on CUDA without recompiling: vnpu tensors are copied to the model's device (in
    # stream order: the update waits for queued work, and a run after it reads the new weights); CPU tensors
    # need allow_h2d_copy; user-managed vnpu tensors are used in place; use_inactive leaves the running weights.
    cpu, path, _ = mlp
    package = torch._inductor.aoti_load_package(path)  # its own weights: the module's package keeps the old
    names = sorted(package.get_constant_fqns())
    assert names and set(names) <= {n for n, _ in cpu.named_parameters()}
    x = torch.randn(6, 16)
    xv = x.to("vnpu")

    def check(weights):
        with torch.no_grad():
            torch.testing.assert_close(package(xv)[0].cpu(), _with_weights(cpu, weights)(x)[0], **TOL)

    torch.manual_seed(3)
    new = {n: torch.randn_like(cpu.get_parameter(n)) for n in names}
    a = torch.randn(1024, 1024, device="vnpu")
    late = (a @ a @ a).sum() * 0  # the new weights are produced behind ~0.1-1 s of queued work
    package.load_constants({n: v.to("vnpu") + late for n, v in new.items()}, check_full_update=True)
    check(new)

    new2 = {n: v * 0.5 + 1 for n, v in new.items()}
    with pytest.raises(RuntimeError, match="allow_h2d_copy"):
        package.load_constants(new2, check_full_update=True)
    check(new)  # unchanged after the refusal
    package.load_constants(new2, check_full_update=True, allow_h2d_copy=True)
    check(new2)

    # Inactive buffer: the running weights stay (AOTInductor swaps buffers only through its C++ runner).
    package.loader.load_constants({n: v.to("vnpu") * 3 for n, v in new.items()}, True, True)
    check(new2)

    # User-managed: the model reads the caller's vnpu tensors, so an in-place change is seen by the next run.
    managed = {n: v.to("vnpu") for n, v in new.items()}
    package.load_constants(managed, check_full_update=True, user_managed=True)
    check(new)
    for v in managed.values():
        v.mul_(-2)
    check({n: v * -2 for n, v in new.items()})

    with pytest.raises(RuntimeError, match="has shape"):
        package.load_constants({names[0]: torch.zeros(3, device="vnpu")}, check_full_update=False)
    check({n: v * -2 for n, v in new.items()})


def _handle(pointer: int):
    """A C pointer as AOTInductor's Python run() takes a stream handle (pybind11's void*: a PyCapsule)."""
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(pointer, None, None)


def test_explicit_stream_argument_runs_on_that_stream(mlp):
    # AOTInductor's run(inputs, stream_handle) with a vnpu stream (torch.vnpu.Stream.vnpu_stream), as with a
    # cudaStream_t on CUDA: the model's work is queued on that stream, behind what is queued there, while the
    # current stream stays idle.
    cpu, _, package = mlp
    torch.manual_seed(4)
    x, w = torch.randn(32, 512), torch.randn(512, 512) / 24
    with torch.no_grad():
        ref = cpu((x @ w)[:, :16])[0]
    side = torch.vnpu.Stream()
    with torch.vnpu.stream(side):
        xv, wv = x.to("vnpu"), w.to("vnpu")
        y = (xv @ wv @ torch.eye(512, device="vnpu"))[:, :16].contiguous()
    torch.vnpu.current_stream().synchronize()
    out = package.loader.run([y], _handle(side.vnpu_stream))[0]
    assert torch.vnpu.current_stream().query()  # nothing was queued on the current stream
    side.synchronize()
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="not a stream of vnpu:0"):
        package.loader.run([y], _handle(12345))


def test_package_in_a_fresh_process_with_runtime_input_checks(mlp, tmp_path):
    # AOTI_RUNTIME_CHECK_INPUTS=1 (read once per model, at its first run: hence a fresh process) adds AOTInductor's
    # dtype/shape/stride checks inside the model. vnpu's device check runs first, on every run; AOTInductor's own
    # (the device type only) would let an input on vnpu:1 through. A wrong shape still raises AOTInductor's error.
    cpu, path, _ = mlp
    x = torch.randn(7, 16)
    with torch.no_grad():
        torch.save({"x": x, "ref": cpu(x)[:2]}, tmp_path / "io.pt")
    code = (
        "import sys, torch\n"
        "io = torch.load(sys.argv[2])\n"
        "package = torch._inductor.aoti_load_package(sys.argv[1])\n"
        "out = package(io['x'].to('vnpu'))\n"
        "torch.testing.assert_close([o.cpu() for o in out[:2]], list(io['ref']), rtol=1e-5, atol=1e-5)\n"
        "print('ok', out[0].device)\n"
        "for bad in (io['x'], io['x'].to('vnpu:1'), torch.randn(7, 15, device='vnpu')):\n"
        "    try:\n"
        "        package(bad)\n"
        "        print('accepted')\n"
        "    except RuntimeError as e:\n"
        "        print('raised', repr(str(e)))\n"
        "print('usable', package(io['x'].to('vnpu'))[0].shape)\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(path), str(tmp_path / "io.pt")], cwd=HERE,
                       capture_output=True, text=True, timeout=600, env={**os.environ, "AOTI_RUNTIME_CHECK_INPUTS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.split("\n")
    assert lines[0] == "ok vnpu:0" and lines[4] == "usable torch.Size([7, 8])", r.stdout
    assert "found at least two devices, vnpu:0 and cpu!" in lines[1], r.stdout
    assert "found at least two devices, vnpu:0 and vnpu:1!" in lines[2], r.stdout
    assert lines[3].startswith("raised"), r.stdout
    assert "input_handles[0]: unmatched dim value at 1, expected: 16, but got: 15" in r.stderr + lines[3]


def test_cpu_input_raises_eagers_device_mismatch_and_the_device_stays_usable(mlp):
    # vnpu's runner raises eager's device mismatch before the model runs (without its check, the first extern
    # kernel, addmm, would raise it inside the model).
    cpu, _, package = mlp
    x = torch.randn(4, 16)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device, but found at least two "
                                           "devices, vnpu:0 and cpu"):
        package(x)
    torch.vnpu.synchronize()
    with torch.no_grad():
        torch.testing.assert_close(package(x.to("vnpu"))[0].cpu(), cpu(x)[0], **TOL)


def test_cpu_input_of_a_fused_kernel_raises_eagers_device_mismatch(pointwise):
    # Unchecked, the fused kernel would read the host tensor asynchronously on the vnpu stream (a later change by
    # the caller changes the output), and CUDA's would fault on the host pointer. A zero-size tensor on the wrong
    # device is refused the same way (its data is never touched).
    cpu, _, package = pointwise
    x = torch.randn(64)
    for bad in (x, torch.empty(0)):
        with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device, but found at least "
                                               r"two devices, vnpu:0 and cpu! .*input 0 .*\.to\(\"vnpu:0\"\)"):
            package(bad)
    torch.vnpu.synchronize()
    with torch.no_grad():
        torch.testing.assert_close(package(x.to("vnpu")).cpu(), cpu(x), **TOL)


def test_input_on_another_vnpu_raises_eagers_device_mismatch(pointwise):
    # A package loaded on vnpu:0 runs on vnpu:0's stream: unchecked, it would read an input of vnpu:1 without
    # waiting for vnpu:1's stream, before the input is written.
    cpu, _, package = pointwise
    x = torch.randn(64)
    x1 = x.to("vnpu:1") + _late("vnpu:1")
    with pytest.raises(RuntimeError, match=r"found at least two devices, vnpu:0 and vnpu:1! .*input 0 .*"
                                           r"\.to\(\"vnpu:0\"\)"):
        package(x1)
    with torch.no_grad():
        torch.testing.assert_close(package(x1.to("vnpu:0")).cpu(), cpu(x), **TOL)


def test_package_runs_on_its_device_when_another_device_is_current(pointwise):
    # Inputs on the package's device, vnpu:1 current: the model runs on vnpu:0's current stream (behind the
    # input's producer), its outputs are vnpu:0 tensors, and vnpu:1 and the current device are left alone.
    cpu, _, package = pointwise
    torch.vnpu.synchronize(1)
    x = torch.randn(64)
    x0 = x.to("vnpu:0") + _late("vnpu:0")
    with torch.vnpu.device(1):
        out = package(x0)
        assert torch.vnpu.current_device() == 1
        assert torch.vnpu.current_stream(1).query()
    assert out.device == torch.device("vnpu:0")
    with torch.no_grad():
        torch.testing.assert_close(out.cpu(), cpu(x), **TOL)


def test_bare_shared_library_says_to_build_a_package():
    class M(nn.Module):
        def forward(self, x):
            return x.sin() + 1

    ep = torch.export.export(M(), (torch.randn(4, device="vnpu"),))
    with pytest.raises(Exception, match="AOTInductor on vnpu builds packages only"):
        torch._inductor.aot_compile(ep.module(), (torch.randn(4, device="vnpu"),))
