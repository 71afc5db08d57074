"""Tensor.item() on vnpu returns the same Python value and type as on CPU, in stream order."""
import math

import pytest
import torch

DEV = "vnpu"
SHAPES = [(), (1,), (1, 1), (1, 1, 1)]
VALUES = {
    torch.bool: [True, False],
    torch.int64: [0, -7, 2**40 + 3, -(2**62)],
    torch.float32: [0.0, -1.5, 3.1415927, 1e-30, float("inf")],
    torch.bfloat16: [0.0, 1.0, -2.5, 3.140625, 1e20],
}
CASES = [(dt, v, s) for dt, vals in VALUES.items() for v in vals for s in SHAPES]


def _same_python_value(a, b):
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, float) and math.isnan(b):
        assert math.isnan(a)
    else:
        assert a == b


@pytest.mark.parametrize("dtype,value,shape", CASES,
                         ids=[f"{str(d).split('.')[-1]}-{v}-{len(s)}d" for d, v, s in CASES])
def test_item_matches_cpu(dtype, value, shape):
    c = torch.tensor(value, dtype=dtype).reshape(shape)
    d = c.to(DEV)
    _same_python_value(d.item(), c.item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_item_nan_and_negative_zero(dtype):
    n = torch.tensor(float("nan"), dtype=dtype).to(DEV).item()
    assert isinstance(n, float) and math.isnan(n)
    z = torch.tensor(-0.0, dtype=dtype).to(DEV).item()
    assert z == 0.0 and math.copysign(1.0, z) == -1.0


@pytest.mark.parametrize("dtype", list(VALUES))
@pytest.mark.parametrize("shape", SHAPES, ids=["0d", "1d", "2d", "3d"])
def test_item_after_inplace_op_on_device(dtype, shape):
    # The in-place op is queued on the stream; item() must observe it (stream ordering).
    c = torch.ones(shape, dtype=dtype)
    d = c.to(DEV)
    if dtype == torch.bool:
        d.logical_not_()
        c.logical_not_()
    else:
        d.mul_(3).add_(2)
        c.mul_(3).add_(2)
    _same_python_value(d.item(), c.item())
    d.zero_()
    c.zero_()
    _same_python_value(d.item(), c.item())


def test_item_after_long_chain_of_inplace_ops():
    d = torch.zeros((), device=DEV)
    big = torch.ones(1 << 20, device=DEV)
    for _ in range(50):
        d.add_(big.sum())  # each step depends on a large reduction queued before it
    assert d.item() == 50.0 * (1 << 20)


def test_item_of_views_and_reductions():
    c = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    d = c.to(DEV)
    _same_python_value(d[1, 2, 3].item(), c[1, 2, 3].item())
    _same_python_value(d[:, 1:2, 2:3][1:].item(), c[:, 1:2, 2:3][1:].item())
    _same_python_value(d.sum().item(), c.sum().item())
    _same_python_value(d.argmax().item(), c.argmax().item())
    _same_python_value((d > 5).all().item(), (c > 5).all().item())
    _same_python_value(d.to(torch.bfloat16).mean().item(), c.to(torch.bfloat16).mean().item())


def test_item_on_second_device_and_other_stream():
    d = torch.full((1,), 4.0, device="vnpu:1")
    d.pow_(2)
    assert d.item() == 16.0
    s = torch.vnpu.Stream()
    x = torch.zeros(1, device=DEV)
    s.wait_stream(torch.vnpu.current_stream())
    with torch.vnpu.stream(s):
        x.add_(5)
    # Work on a side stream is ordered before item() through wait_stream, as on CUDA.
    torch.vnpu.current_stream().wait_stream(s)
    assert x.item() == 5.0


def test_item_on_multi_element_raises_like_cpu():
    with pytest.raises(RuntimeError):
        torch.ones(2).item()
    with pytest.raises(RuntimeError):
        torch.ones(2, device=DEV).item()
    with pytest.raises(RuntimeError):
        torch.ones(0, device=DEV).item()


def test_python_scalar_conversions():
    c = torch.tensor([[2.75]])
    d = c.to(DEV)
    assert float(d) == float(c)
    assert int(d) == int(c)
    assert bool(d) is bool(c)
    assert d.tolist() == c.tolist()
    assert torch.tensor(True, device=DEV).tolist() is True
    assert isinstance(torch.tensor(3, device=DEV).tolist(), int)
