"""Zero-size dimensions: shapes, dtypes and values equal to CPU."""
import pytest
import torch

DEV = "vnpu"


def _check(fn, *cpu_args):
    ref = fn(*cpu_args)
    out = fn(*[a.to(DEV) if isinstance(a, torch.Tensor) else a for a in cpu_args])
    _assert_same(out, ref)


def _assert_same(out, ref):
    if isinstance(ref, (tuple, list)):
        assert type(out) is type(ref) or isinstance(out, tuple)
        assert len(out) == len(ref)
        for o, r in zip(out, ref):
            _assert_same(o, r)
        return
    assert out.device.type == "vnpu"
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert out.dtype == ref.dtype, (out.dtype, ref.dtype)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-6, atol=1e-6, equal_nan=True)


E = torch.empty(0, 4)       # 0 x 4
F = torch.randn(3, 0)       # 3 x 0
Z3 = torch.randn(2, 0, 5)   # 2 x 0 x 5


@pytest.mark.parametrize("t", [E, F, Z3, torch.empty(0)], ids=["0x4", "3x0", "2x0x5", "0"])
def test_full_reductions(t):
    _check(torch.sum, t)                         # 0
    _check(torch.mean, t)                        # nan
    _check(torch.prod, t)                        # 1
    _check(lambda x: x.sum(dtype=torch.float64), t)
    _check(lambda x: torch.count_nonzero(x), t)
    _check(lambda x: x.any(), t)
    _check(lambda x: x.all(), t)
    _check(lambda x: x.norm(), t)
    _check(lambda x: torch.logsumexp(x.flatten(), 0), t)


@pytest.mark.filterwarnings("ignore:std\\(\\)")
def test_dim_reductions():
    _check(lambda x: x.sum(0), E)            # -> (4,) zeros
    _check(lambda x: x.sum(1), E)            # -> (0,)
    _check(lambda x: x.mean(0), E)           # -> (4,) nan
    _check(lambda x: x.sum(1), F)            # -> (3,) zeros
    _check(lambda x: x.prod(1), F)           # -> (3,) ones
    _check(lambda x: x.sum((0, 2)), Z3)
    _check(lambda x: x.sum(1, keepdim=True), Z3)
    _check(lambda x: x.max(0), F)            # max over the non-empty dim: (0,) values and indices
    _check(lambda x: x.max(2), Z3)           # -> (2, 0)
    _check(lambda x: x.amax(0), F)
    _check(lambda x: x.argmax(2), Z3)
    _check(lambda x: x.min(1), E)            # -> (0,)
    _check(lambda x: torch.cumsum(x, 0), E)
    _check(lambda x: torch.softmax(x, 1), F)
    _check(lambda x: torch.std(x, 0), F)


def test_max_over_empty_dim_raises_like_cpu():
    with pytest.raises((RuntimeError, IndexError)):
        F.max(1)
    with pytest.raises((RuntimeError, IndexError)):
        F.to(DEV).max(1)
    # Full max() of an empty tensor: CPU and CUDA reject it at the call (host-side argument check).
    d = F.to(DEV)
    try:
        with pytest.raises(RuntimeError, match="numel"):
            d.max()
    finally:
        try:
            torch.vnpu.synchronize()  # drain a late (asynchronous) report so later tests start clean
        except RuntimeError:
            pass
    with pytest.raises(RuntimeError):
        F.max()


@pytest.mark.parametrize("dim", [0, 1])
def test_cat(dim):
    a = torch.randn(0, 4)
    b = torch.randn(3, 4)
    _check(lambda x, y: torch.cat([x, y]), a, b)
    _check(lambda x, y: torch.cat([y, x, y]), a, b)
    _check(lambda x: torch.cat([x, x]), a)
    c = torch.randn(3, 0)
    d = torch.randn(3, 2)
    _check(lambda x, y: torch.cat([x, y], 1), c, d)
    _check(lambda x: torch.cat([x, x], dim), torch.empty(0, 0))
    # Legacy: 1-d empty tensors are skipped by cat.
    _check(lambda x, y: torch.cat([x, y], dim), torch.empty(0), b)
    _check(lambda x, y: torch.stack([x, y]), a, a)


@pytest.mark.parametrize("m,n", [(3, 5), (0, 5), (3, 0), (0, 0)])
def test_matmul_k0(m, n):
    a = torch.randn(m, 0)
    b = torch.randn(0, n)
    _check(torch.matmul, a, b)                   # zeros(m, n)
    _check(torch.mm, a, b)
    _check(lambda x, y: x @ y, a, b)
    _check(torch.bmm, torch.randn(2, m, 0), torch.randn(2, 0, n))
    _check(torch.mv, torch.randn(m, 0), torch.randn(0))
    _check(torch.dot, torch.randn(0), torch.randn(0))


@pytest.mark.parametrize("beta,alpha", [(1.0, 1.0), (0.5, 2.0), (0.0, 1.0)])
def test_addmm_k0_equals_beta_bias(beta, alpha):
    bias = torch.randn(5)          # broadcast bias
    a = torch.randn(3, 0)
    b = torch.randn(0, 5)
    ref = torch.addmm(bias, a, b, beta=beta, alpha=alpha)
    torch.testing.assert_close(ref, (beta * bias).expand(3, 5))
    _check(lambda c, x, y: torch.addmm(c, x, y, beta=beta, alpha=alpha), bias, a, b)
    full_bias = torch.randn(3, 5)
    _check(lambda c, x, y: torch.addmm(c, x, y, beta=beta, alpha=alpha), full_bias, a, b)
    _check(lambda c, x, y: torch.baddbmm(c, x, y, beta=beta, alpha=alpha),
           torch.randn(2, 3, 5), torch.randn(2, 3, 0), torch.randn(2, 0, 5))
    _check(lambda c, x, y: torch.addmv(c, x, y, beta=beta, alpha=alpha), torch.randn(3), a, torch.randn(0))


def test_addmm_k0_nan_bias_with_beta0_is_zero():
    # beta=0 ignores the bias, even nan/inf (documented).
    bias = torch.tensor([float("nan"), float("inf"), 1.0])
    _check(lambda c, x, y: torch.addmm(c, x, y, beta=0.0), bias, torch.randn(2, 0), torch.randn(0, 3))


def test_linear_with_k0():
    x = torch.randn(4, 0)
    w = torch.randn(3, 0)
    b = torch.randn(3)
    _check(torch.nn.functional.linear, x, w, b)
    _check(torch.nn.functional.linear, torch.randn(0, 2), torch.randn(3, 2), b)


def test_reshape_and_views():
    _check(lambda x: x.reshape(0, 2, 2), E)
    _check(lambda x: x.reshape(-1, 5), Z3)
    _check(lambda x: x.view(0), E)
    _check(lambda x: x.t(), F)
    _check(lambda x: x.permute(2, 0, 1).contiguous(), Z3)
    _check(lambda x: x.unsqueeze(1).expand(0, 3, 4), E)
    _check(lambda x: x.flatten(), Z3)
    _check(lambda x: x[:, :0], torch.randn(3, 4))
    _check(lambda x: x.narrow(1, 2, 0), torch.randn(3, 4))
    _check(lambda x: x.split(2, 0)[0] if x.shape[0] else x, E)
    _check(lambda x: torch.chunk(x, 3, 1)[0], F)
    _check(lambda x: x.reshape(-1).view(3, -1), E)         # -1 resolves to 0 for an empty tensor
    with pytest.raises(RuntimeError):
        E.to(DEV).view(5, 1)


def test_indexing():
    x = torch.randn(4, 5)
    empty_idx = torch.empty(0, dtype=torch.long)
    _check(lambda t, i: t[i], x, empty_idx)                  # (0, 5)
    _check(lambda t, i: t[:, i], x, empty_idx)               # (4, 0)
    _check(lambda t, i: torch.index_select(t, 0, i), x, empty_idx)
    _check(lambda t, i: t.gather(1, i.reshape(4, 0)), x, empty_idx)
    _check(lambda t, m: t[m], x, torch.zeros(4, 5, dtype=torch.bool))   # (0,)
    _check(lambda t: t[0:0], x)
    _check(lambda t: t[E.shape[0]:], torch.randn(0, 2))
    _check(lambda t, i: t[i], torch.randn(0, 3), empty_idx)
    _check(lambda t: torch.nonzero(t), torch.zeros(0, 3))


def test_inplace_indexing_writes_nothing():
    x = torch.randn(4, 5)
    d = x.to(DEV)
    idx = torch.empty(0, dtype=torch.long, device=DEV)
    d[idx] = 1.0
    d[torch.zeros(4, 5, dtype=torch.bool, device=DEV)] = 2.0
    d.index_add_(0, idx, torch.empty(0, 5, device=DEV))
    d.index_put_((idx,), torch.empty(0, 5, device=DEV))
    d.index_copy_(0, idx, torch.empty(0, 5, device=DEV))
    d.masked_fill_(torch.zeros(4, 5, dtype=torch.bool, device=DEV), 3.0)
    d[:, 2:2] = 5.0
    assert torch.equal(d.cpu(), x)


def test_elementwise_and_factories():
    _check(lambda x: x * 2 + 1, E)
    _check(lambda x, y: x + y, E, torch.randn(4))                # broadcast to (0, 4)
    _check(lambda x, y: torch.where(x > 0, x, y), F, torch.randn(3, 0))
    _check(lambda x: torch.exp(x).to(torch.float16), Z3)
    _check(lambda x: x.sort(1), Z3)
    _check(lambda x: x.topk(0, 1), torch.randn(3, 4))
    for shape in [(0,), (2, 0), (0, 3, 0)]:
        for f in (torch.zeros, torch.ones, torch.empty):
            out = f(shape, device=DEV)
            assert out.shape == shape and out.numel() == 0 and out.device.type == "vnpu"
        _assert_same(torch.full(shape, 3.0, device=DEV), torch.full(shape, 3.0))
        _assert_same(torch.arange(0, device=DEV).reshape(shape), torch.arange(0).reshape(shape))


def test_transfers_and_item_errors():
    d = E.to(DEV)
    assert d.cpu().shape == (0, 4)
    assert torch.empty(0, 3).to(DEV).to("vnpu:1").shape == (0, 3)
    assert d.tolist() == []
    with pytest.raises(RuntimeError):
        d.item()


def test_backward_through_zero_size():
    x = torch.randn(3, 0, requires_grad=True)
    w = torch.randn(0, 4, requires_grad=True)
    b = torch.randn(4, requires_grad=True)
    xd = x.detach().to(DEV).requires_grad_()
    wd = w.detach().to(DEV).requires_grad_()
    bd = b.detach().to(DEV).requires_grad_()
    (torch.addmm(b, x, w) ** 2).sum().backward()
    (torch.addmm(bd, xd, wd) ** 2).sum().backward()
    _assert_same(xd.grad, x.grad)
    _assert_same(wd.grad, w.grad)
    _assert_same(bd.grad, b.grad)
