"""Device mismatches and invalid device indices raise like CUDA; CPU scalars and CPU index tensors are
accepted like on CUDA."""
import re

import pytest
import torch
import torch.nn.functional as F

DEV = "vnpu"
SAME_DEVICE = "Expected all tensors to be on the same device"


@pytest.fixture
def xy():
    torch.manual_seed(0)
    return torch.randn(3, 3, device=DEV), torch.randn(3, 3)


MIXED_OPS = {
    "add": lambda x, y: x + y,
    "radd": lambda x, y: y + x,
    "mul": lambda x, y: torch.mul(x, y),
    "mm": lambda x, y: torch.mm(x, y),
    "rmm": lambda x, y: torch.mm(y, x),
    "matmul": lambda x, y: x @ y,
    "linear": lambda x, y: F.linear(x, y),
    "cat": lambda x, y: torch.cat([x, y]),
    "where": lambda x, y: torch.where(x > 0, x, y),
    "inplace_add": lambda x, y: x.add_(y),
    "addmm": lambda x, y: torch.addmm(x, x, y),
}


@pytest.mark.parametrize("op", list(MIXED_OPS))
def test_vnpu_and_cpu_tensor_mix_raises(op, xy):
    x, y = xy
    x_before = x.cpu()
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        MIXED_OPS[op](x, y)
    torch.vnpu.synchronize()  # raised on the host, nothing sticky left behind
    assert torch.equal(x.cpu(), x_before), "a rejected in-place op must not write"


def test_message_names_both_devices(xy):
    x, y = xy
    with pytest.raises(RuntimeError) as ei:
        x + y
    msg = str(ei.value)
    assert "vnpu:0" in msg and "cpu" in msg


@pytest.mark.parametrize("call, text", [
    # CUDA's text: the common device first, then the argument on another device and the op
    (lambda x, y: torch.mm(x, y), "vnpu:0 and cpu! (when checking argument for argument mat2 in method aten::mm)"),
    (lambda x, y: torch.mm(y, x), "cpu and vnpu:0! (when checking argument for argument mat2 in method aten::mm)"),
    (lambda x, y: torch.cat([x, y]), "(when checking argument for argument tensors in method aten::cat)"),
    (lambda x, y: x.index_select(0, torch.tensor([0, 1]).expand(2)),
     "(when checking argument for argument index in method aten::index_select)"),
])
def test_message_names_the_argument_and_the_op(call, text, xy):
    x, y = xy
    with pytest.raises(RuntimeError, match=SAME_DEVICE) as ei:
        call(x, y)
    assert text in str(ei.value) and "module.to" not in str(ei.value)


def test_module_hint_only_for_a_cpu_tensor():
    with pytest.raises(RuntimeError, match=SAME_DEVICE) as ei:
        torch.nn.Linear(4, 4).to("vnpu:0")(torch.ones(2, 4, device="vnpu:1"))
    assert "vnpu:0 and vnpu:1" in str(ei.value) and "module" not in str(ei.value)


def test_module_left_on_the_cpu_is_named():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    with pytest.raises(RuntimeError, match=SAME_DEVICE) as ei:
        model(torch.randn(2, 3, device=DEV))
    assert "module's parameter" in str(ei.value) and 'module.to("vnpu")' in str(ei.value)
    assert model.to(DEV)(torch.randn(2, 3, device=DEV)).shape == (2, 1)  # the fix works


@pytest.mark.parametrize("op", ["add", "mm"])
def test_two_vnpu_devices_mix_raises(op):
    a = torch.randn(3, 3, device="vnpu:0")
    b = torch.randn(3, 3, device="vnpu:1")
    with pytest.raises(RuntimeError, match=SAME_DEVICE) as ei:
        MIXED_OPS[op](a, b)
    assert "vnpu:0" in str(ei.value) and "vnpu:1" in str(ei.value)
    # A 0-dim tensor on another *vnpu* device is not a CPU scalar: rejected as on CUDA.
    with pytest.raises(RuntimeError, match=SAME_DEVICE):
        a + torch.tensor(1.0, device="vnpu:1")


ZERO_DIM_OPS = {
    "add": lambda x, s: x + s,
    "radd": lambda x, s: s + x,
    "mul": lambda x, s: x * s,
    "div": lambda x, s: x / s,
    "pow": lambda x, s: x ** s,
    "where": lambda x, s: torch.where(x > 0, x, s),
    "maximum": lambda x, s: torch.maximum(x, s),
    "inplace_mul": lambda x, s: x.clone().mul_(s),
    "addcmul": lambda x, s: torch.addcmul(x, x, x, value=2.0) + s,
}


@pytest.mark.parametrize("op", list(ZERO_DIM_OPS))
def test_zero_dim_cpu_tensor_accepted(op, xy):
    x, _ = xy
    s = torch.tensor(2.0)
    out = ZERO_DIM_OPS[op](x, s)
    assert out.device == torch.device("vnpu:0")
    torch.testing.assert_close(out.cpu(), ZERO_DIM_OPS[op](x.cpu(), s))


def test_zero_dim_cpu_int_and_bool_scalars(xy):
    x, _ = xy
    out = x * torch.tensor(3)
    assert out.dtype == torch.float32  # type promotion as for a CPU scalar
    torch.testing.assert_close(out.cpu(), x.cpu() * 3)
    xi = torch.arange(6, device=DEV)
    assert torch.equal((xi + torch.tensor(True)).cpu(), torch.arange(6) + 1)


def test_cpu_index_tensors_accepted_as_on_cuda():
    # CUDA accepts CPU index tensors for indexing and index_put_ (test_indexing.py::test_cpu_indices).
    x = torch.ones(10, device=DEV)
    idx = torch.tensor([0, 1])
    x[idx] = torch.zeros(2, device=DEV)  # index_put_
    ref = torch.ones(10)
    ref[:2] = 0
    assert torch.equal(x.cpu(), ref)
    out = x[idx]  # index
    assert out.device == torch.device("vnpu:0")
    assert torch.equal(out.cpu(), torch.zeros(2))
    m = torch.tensor([True, False] * 5)
    assert torch.equal(x[m].cpu(), ref[m])


def test_invalid_device_index_in_factory():
    torch.device("vnpu:7")  # constructing the device object itself is fine
    for fn in (lambda: torch.empty(2, device="vnpu:7"),
               lambda: torch.zeros(2, 3, device=torch.device("vnpu", 7)),
               lambda: torch.randn(2).to("vnpu:7")):
        with pytest.raises(RuntimeError) as ei:
            fn()
        msg = str(ei.value)
        assert re.search(r"\b7\b", msg), msg
        assert "device" in msg.lower(), msg


def test_set_device_invalid_raises():
    with pytest.raises(RuntimeError) as ei:
        torch.vnpu.set_device(5)
    assert "5" in str(ei.value)
    assert torch.vnpu.current_device() == 0  # unchanged
    with pytest.raises(RuntimeError):
        torch.vnpu.set_device("vnpu:2")
    with pytest.raises(RuntimeError):
        with torch.vnpu.device(5):
            pass
    assert torch.vnpu.current_device() == 0
    with pytest.raises(RuntimeError):
        torch.vnpu.get_device_properties(7)
    with pytest.raises(RuntimeError):
        torch.vnpu.synchronize(7)


def test_valid_device_switching_after_errors():
    with pytest.raises(RuntimeError):
        torch.vnpu.set_device(9)
    torch.vnpu.set_device(1)
    assert torch.vnpu.current_device() == 1
    assert torch.empty(2, device="vnpu").device == torch.device("vnpu:1")
    torch.vnpu.set_device(0)
    with torch.vnpu.device(1):
        assert torch.zeros(1, device="vnpu").device == torch.device("vnpu:1")
    assert torch.zeros(1, device="vnpu").device == torch.device("vnpu:0")


def test_cross_device_copy_is_allowed(xy):
    # copy_ / to() are the sanctioned way across devices.
    x, y = xy
    x.copy_(y)
    assert torch.equal(x.cpu(), y)
    z = torch.empty(3, 3, device="vnpu:1")
    z.copy_(x)
    assert torch.equal(z.cpu(), y)


@pytest.mark.parametrize("call", [
    lambda x, o: torch.add(x, x, out=o),
    lambda x, o: torch.sum(x, (0, 1), out=o),
    lambda x, o: torch._C._nn.mse_loss(x, x, 2, out=o),
])
def test_cpu_scalar_out_is_rejected_like_cuda(call):
    # 0-dim CPU tensors are accepted as inputs (as on CUDA), never as outputs: they would not be written.
    x = torch.rand(4, 5, device="vnpu")
    o = torch.full((), 7.0)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        call(x, o)
    assert o.item() == 7.0
    torch.testing.assert_close(torch.add(x, torch.tensor(1.0)).cpu(), x.cpu() + 1)  # CPU scalar input still fine


def test_quantized_tensors_are_refused_at_the_call():
    """vnpu has no quantized kernels: every way to make a quantized vnpu tensor raises NotImplementedError at the
    call (it used to return a tensor whose dtype said quint8 while is_quantized was False, and whose kernel failed
    later); the device and other tensors stay healthy."""
    x = torch.randn(4, device="vnpu")
    scales, zeros = torch.tensor([0.1, 0.2], device="vnpu"), torch.tensor([0, 0], device="vnpu")
    makers = [
        lambda: torch.quantize_per_tensor(x, 0.1, 0, torch.quint8),
        lambda: torch.quantize_per_tensor_dynamic(x, torch.quint8, False),
        lambda: torch.quantize_per_channel(x.view(2, 2), scales, zeros, 0, torch.qint8),
        lambda: torch._empty_affine_quantized((2,), scale=0.1, zero_point=0, dtype=torch.quint8, device="vnpu"),
        lambda: torch.empty(3, dtype=torch.qint8, device="vnpu"),
        lambda: torch.quantize_per_tensor(x.cpu(), 0.1, 0, torch.quint8).to("vnpu"),
    ]
    for make in makers:
        with pytest.raises(NotImplementedError, match="does not support quantized tensors"):
            make()
    torch.vnpu.synchronize()  # nothing pending
    assert torch.equal((x * 2).cpu(), x.cpu() * 2)
