"""Eager ops on vnpu against the CPU oracle."""
import pytest
import torch


def test_import_torch_registers_vnpu():
    assert torch._C._get_privateuse1_backend_name() == "vnpu"
    assert torch.vnpu.is_available()
    assert torch.accelerator.current_accelerator().type == "vnpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16,
                                   torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
                                   torch.complex64, torch.complex128, torch.bool, torch.float8_e4m3fn,
                                   torch.float8_e5m2, torch.uint16, torch.uint32, torch.uint64])
def test_roundtrip_keeps_dtype_and_values(dtype):
    x = (torch.randn(5, 7) * 10).abs().to(dtype)
    y = x.to("vnpu")
    assert y.device.type == "vnpu" and y.dtype == dtype
    assert torch.equal(y.cpu(), x)


def test_elementwise_and_reductions_match_cpu():
    torch.manual_seed(0)
    a, b = torch.randn(16, 33), torch.randn(16, 33)
    da, db = a.to("vnpu"), b.to("vnpu")
    for f in (lambda x, y: x + y * 2, lambda x, y: torch.sin(x) * y.exp(), lambda x, y: (x @ y.T).sum(1),
              lambda x, y: torch.softmax(x, -1) - y.clamp(min=0), lambda x, y: x[:, ::3].mean(0)):
        assert torch.equal(f(da, db).cpu(), f(a, b))


def test_data_dependent_ops_match_cpu():
    x = torch.tensor([[0.0, 1.5, -2.0], [3.0, 0.0, 4.0]])
    d = x.to("vnpu")
    assert torch.equal(d[d > 0].cpu(), x[x > 0])
    assert torch.equal(torch.nonzero(d).cpu(), torch.nonzero(x))
    assert torch.equal(torch.unique(d).cpu(), torch.unique(x))


def test_autograd_matches_cpu():
    torch.manual_seed(0)
    w = torch.randn(8, 4, requires_grad=True)
    x = torch.randn(3, 8)
    wd = w.detach().to("vnpu").requires_grad_()
    (torch.tanh(x @ w) ** 2).sum().backward()
    (torch.tanh(x.to("vnpu") @ wd) ** 2).sum().backward()
    assert wd.grad.device.type == "vnpu"
    torch.testing.assert_close(wd.grad.cpu(), w.grad, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.complex128])
def test_64bit_dtypes_are_not_downcast(dtype):
    x = torch.tensor([2**40 + 1, 3], dtype=torch.int64).to(dtype)
    y = (x.to("vnpu") * 3 + 1).sum()
    assert y.dtype == dtype
    assert y.item() == ((x * 3 + 1).sum()).item()


def test_float8_storage_converts_like_cpu():
    x = torch.randn(64)
    for dt in (torch.float8_e4m3fn, torch.float8_e5m2):
        assert torch.equal(x.to("vnpu").to(dt).float().cpu(), x.to(dt).float())
