"""AOTInductor on vnpu (issue #9): ``aoti_compile_and_package`` of an exported vnpu model, ``aoti_load_package``.

A loaded package has the C++ wrapper's execution model (test_compile_cpp_wrapper.py): buffers from the caching
allocator, extern kernels as vnpu ops (through AOTInductor's proxy executor and the dispatcher), fused kernels on
the current stream, asynchronous. Oracle: eager CPU on the same inputs and weights (float32 within 1e-5).
Two packages are compiled once per module (an MLP with a dynamic batch, a conv + batch norm model).
Wrong-device input behaves as on CUDA (AOTInductor checks input devices only with AOTI_RUNTIME_CHECK_INPUTS=1).
"""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
TOL = dict(rtol=1e-5, atol=1e-5)


class MLP(nn.Module):
    """An MLP whose second output goes through ``topk``, an ATen fallback (AOTInductor's proxy executor)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))

    def forward(self, x):
        y = self.net(x)
        return y, y.topk(3, dim=1).values


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(F.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


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


def test_mlp_package_matches_eager_cpu_for_two_batch_sizes(mlp):
    cpu, _, package = mlp
    torch.vnpu.reset_op_stats()
    for n in (4, 13):  # one package, dynamic batch
        x = torch.randn(n, 16)
        out, top = package(x.to("vnpu"))
        assert out.device == top.device == torch.device("vnpu:0") and out.shape == (n, 8) and top.shape == (n, 3)
        with torch.no_grad():
            ref, ref_top = cpu(x)
        torch.testing.assert_close(out.cpu(), ref, **TOL)
        torch.testing.assert_close(top.cpu(), ref_top, **TOL)
    # The extern kernels (boxed dispatcher calls) and the fallback (the proxy executor) ran as vnpu ops.
    ops = torch.vnpu.get_executed_ops()
    assert ops.get("aten::addmm.out", 0) >= 4 and ops.get("aten::topk", 0) == 2, ops


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
    out, _ = package(xv)
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


def test_package_loads_and_runs_in_a_fresh_process_and_checks_input_devices(mlp, tmp_path):
    # With AOTI_RUNTIME_CHECK_INPUTS=1 the model checks each input's device type (as on CUDA: the message is
    # AOTInductor's, its expected value printed twice, "2020(vnpu)" as "11(cuda)").
    cpu, path, _ = mlp
    x = torch.randn(7, 16)
    with torch.no_grad():
        torch.save({"x": x, "ref": cpu(x)}, tmp_path / "io.pt")
    code = (
        "import sys, torch\n"
        "io = torch.load(sys.argv[2])\n"
        "package = torch._inductor.aoti_load_package(sys.argv[1])\n"
        "out = package(io['x'].to('vnpu'))\n"
        "torch.testing.assert_close([o.cpu() for o in out], list(io['ref']), rtol=1e-5, atol=1e-5)\n"
        "print('ok', out[0].device)\n"
        "try:\n"
        "    package(io['x'])\n"
        "except RuntimeError as e:\n"
        "    print('raised')\n"
        "print('usable', package(io['x'].to('vnpu'))[0].shape)\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(path), str(tmp_path / "io.pt")], cwd=HERE,
                       capture_output=True, text=True, timeout=600, env={**os.environ, "AOTI_RUNTIME_CHECK_INPUTS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[:3] == ["ok vnpu:0", "raised", "usable torch.Size([7, 8])"]
    assert "input_handles[0]: unmatched device type, expected: 2020(vnpu), but got: 0" in r.stderr


def test_cpu_input_raises_eagers_device_mismatch_and_the_device_stays_usable(mlp):
    # Unchecked by default, as on CUDA: the first extern kernel (addmm) raises eager's device mismatch inside the
    # model, which AOTInductor's runner raises as RuntimeError.
    cpu, _, package = mlp
    x = torch.randn(4, 16)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device, but found at least two "
                                           "devices, vnpu:0 and cpu"):
        package(x)
    torch.vnpu.synchronize()
    with torch.no_grad():
        torch.testing.assert_close(package(x.to("vnpu"))[0].cpu(), cpu(x)[0], **TOL)


def test_bare_shared_library_says_to_build_a_package():
    class M(nn.Module):
        def forward(self, x):
            return x.sin() + 1

    ep = torch.export.export(M(), (torch.randn(4, device="vnpu"),))
    with pytest.raises(Exception, match="AOTInductor on vnpu builds packages only"):
        torch._inductor.aot_compile(ep.module(), (torch.randn(4, device="vnpu"),))
