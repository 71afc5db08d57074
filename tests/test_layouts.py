"""Inputs and outputs in every memory layout give CPU's values and strides (issue #13, items 14 and 15).

One test per kind the layout variants of the OpInfo sweep found (src/torch_vnpu/testing/opinfo.py, LAYOUTS):
- out= kernels that read their outputs: CPU's batch_norm out= kernel takes the mean from `save_mean`, which only
  its functional wrapper fills, so running native_batch_norm through its out= overload gave wrong values for
  non-contiguous inputs (0.2-1.3 off, no error);
- output strides that follow the input layout (channels-last, permuted) where a Meta kernel allocates contiguous;
- explicit out= tensors of the right shape keep their strides, even where the Meta kernel restrides them;
- synchronous kernels see CPU's aliasing: stride-0 in-place arguments, several empty out= tensors.
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

DEV = "vnpu"


def _layouts(x):
    """(name, f) pairs making the same values in different memory layouts."""
    return [
        ("slice", lambda t: torch.stack([t, torch.full_like(t, float("nan"))], -1)[..., 0]),
        ("transposed", lambda t: t.transpose(0, -1).contiguous().transpose(0, -1)),
        ("channels_last", lambda t: t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t),
        ("offset", lambda t: torch.cat([t.new_zeros(3), t.flatten()])[3:].view(t.shape)),
    ]


@pytest.mark.parametrize("layout", ["slice", "transposed", "channels_last", "offset"])
@pytest.mark.parametrize("shape", [(4, 3, 10), (4, 3, 5, 6)])
def test_batch_norm_training_any_layout(layout, shape):
    torch.manual_seed(0)
    base = torch.randn(*shape)
    f = dict(_layouts(base))[layout]
    x_cpu = f(base).requires_grad_()
    x_vn = f(base.to(DEV)).detach().requires_grad_()
    assert x_vn.stride() == x_cpu.stride()
    w = torch.randn(shape[1], requires_grad=True)
    w_vn = w.detach().to(DEV).requires_grad_()
    rm, rv = torch.zeros(shape[1]), torch.ones(shape[1])
    rm_vn, rv_vn = rm.to(DEV), rv.to(DEV)
    y_cpu = F.batch_norm(x_cpu, rm, rv, w, None, training=True)
    y_vn = F.batch_norm(x_vn, rm_vn, rv_vn, w_vn, None, training=True)
    torch.testing.assert_close(y_vn.cpu(), y_cpu)
    assert y_vn.stride() == y_cpu.stride()
    torch.testing.assert_close(rm_vn.cpu(), rm)
    torch.testing.assert_close(rv_vn.cpu(), rv)
    g = torch.randn(shape)
    y_cpu.backward(g)
    y_vn.backward(g.to(DEV))
    torch.testing.assert_close(x_vn.grad.cpu(), x_cpu.grad)
    torch.testing.assert_close(w_vn.grad.cpu(), w.grad)


def test_batchnorm1d_after_transpose_in_a_sequence_model():
    # (batch, time, features) -> BatchNorm1d over features needs (batch, features, time): a transposed view.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 6))
    bn = nn.BatchNorm1d(6)
    x = torch.randn(5, 7, 8)
    ref = bn(model(x).transpose(1, 2))
    model_vn, bn_vn = model.to(DEV), nn.BatchNorm1d(6).to(DEV)
    out = bn_vn(model_vn(x.to(DEV)).transpose(1, 2))
    torch.testing.assert_close(out.cpu(), ref)
    torch.testing.assert_close(bn_vn.running_mean.cpu(), bn.running_mean)
    torch.testing.assert_close(bn_vn.running_var.cpu(), bn.running_var)


@pytest.mark.parametrize("fn", [torch.abs, torch.neg, torch.sigmoid, torch.isinf, torch.logical_not,
                                lambda t: t + 1, lambda t: torch.add(t, t.flip(0)), lambda t: t.clamp(min=0)])
def test_elementwise_results_keep_the_input_layout(fn):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 5)
    for make in (lambda t: t.contiguous(memory_format=torch.channels_last), lambda t: t.permute(0, 2, 1, 3),
                 lambda t: t.permute(3, 2, 1, 0), lambda t: t):
        ref = fn(make(x))
        out = fn(make(x.to(DEV)))
        assert out.stride() == ref.stride(), (out.stride(), ref.stride())
        torch.testing.assert_close(out.cpu(), ref)


def test_composite_with_empty_out_keeps_layout_and_runs_async():
    # abs is a composite calling abs.out(empty(0), x): the empty out= argument is not an "empty input" (which
    # would synchronize), and the kernel's channels-last result layout must reach the vnpu tensor.
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    o = torch.empty(0, device=DEV)
    torch.abs(x.to(DEV), out=o)
    assert o.stride() == torch.abs(x).stride()
    torch.testing.assert_close(o.cpu(), x.abs())


def test_right_shaped_out_keeps_its_strides():
    # The Meta kernel of _linalg_solve_ex restrides a right-shaped out= tensor to column-major; CPU keeps it.
    # The first call's (5, 1) shape is both row- and column-major, so it cannot reveal that.
    torch.manual_seed(0)
    a, b1, b3 = torch.randn(5, 5), torch.randn(5, 1), torch.randn(5, 3)
    for b in (b1, b3):
        out_cpu = torch.empty(b.numel() + 3)[3:].view(b.shape)
        out_vn = torch.empty(b.numel() + 3, device=DEV)[3:].view(b.shape)
        torch.linalg.solve(a, b, out=out_cpu)
        torch.linalg.solve(a.to(DEV), b.to(DEV), out=out_vn)
        assert out_vn.stride() == out_cpu.stride() and out_vn.storage_offset() == out_cpu.storage_offset()
        torch.testing.assert_close(out_vn.cpu(), out_cpu)


def test_sync_kernel_with_several_empty_outs():
    # linalg_lstsq.out has no Meta kernel (runs synchronously); its empty solution and rank outputs must not
    # share host memory while the kernel grows them.
    torch.manual_seed(0)
    a, b = torch.randn(3, 3), torch.randn(3, 3)
    ref = torch.linalg.lstsq(a, b)
    outs = (torch.empty(0, device=DEV), torch.empty(0, device=DEV), torch.empty(0, dtype=torch.int64, device=DEV),
            torch.empty(0, device=DEV))
    torch.linalg.lstsq(a.to(DEV), b.to(DEV), out=outs)
    torch.testing.assert_close(outs[0].cpu(), ref.solution)
    assert outs[0].stride() == ref.solution.stride()
    assert outs[2].item() == ref.rank.item()


def test_sync_kernel_writes_a_stride0_inplace_argument_like_cpu():
    # _native_batch_norm_legit.out runs synchronously; its running_mean may be an expanded (stride-0) tensor,
    # which CPU's kernel writes without complaint (every channel's update lands on the one element, in an order
    # that depends on the threads, so only the other outputs are compared).
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 4, 5), torch.randn(4), torch.randn(4)
    rm0, rv0 = torch.randn(1), torch.rand(1) + 0.5
    results = {}
    for dev in ("cpu", DEV):
        rm, rv = rm0.clone().to(dev).expand(4), rv0.clone().to(dev).expand(4)
        outs = (torch.empty(3, 4, 5, device=dev), torch.empty(4, device=dev), torch.empty(4, device=dev))
        torch.ops.aten._native_batch_norm_legit.out(x.to(dev), w.to(dev), b.to(dev), rm, rv, True, 0.1, 1e-5,
                                                    out=outs[0], save_mean=outs[1], save_invstd=outs[2])
        results[dev] = [t.cpu() for t in outs]
        assert rm.stride() == (0,) and rv.stride() == (0,)
        assert torch.isfinite(rm.cpu()).all() and not torch.equal(rm[0].cpu(), rm0[0])
    for v, c in zip(results[DEV], results["cpu"]):
        torch.testing.assert_close(v, c)


def test_fft_output_strides_follow_dims_and_input_order():
    """CPU's c2r FFT keeps the input's memory order, so its output strides depend on which dims it transforms and
    on the input's permutation; Meta's do not. Signatures that differ only in these are validated separately
    (before: hfftn over all dims of a transposed input reused the strides validated for dims (1, 2), (72, 12, 1)
    where CPU gives (12, 60, 1))."""
    torch.manual_seed(0)
    base = torch.randn(5, 6, 7)
    calls = [
        lambda t: torch.fft.hfftn(t, s=(3, 10), dim=(1, 2), norm="ortho"),
        lambda t: torch.fft.hfftn(t, norm="ortho"),
        lambda t: torch.fft.hfftn(t, s=(8,)),
        lambda t: torch.fft.irfft(t, n=10, dim=1),
        lambda t: torch.fft.irfft(t),
        lambda t: torch.fft.irfft(t, n=7, dim=0),
    ]
    for perm in [(0, 1, 2), (2, 1, 0), (1, 0, 2), (0, 2, 1), (1, 2, 0)]:
        inv = [perm.index(d) for d in range(3)]
        x = base.permute(perm).contiguous().permute(inv)
        for k, fn in enumerate(calls):
            c, v = fn(x), fn(x.to(DEV))
            assert v.stride() == c.stride(), (perm, k, c.stride(), v.stride())
            torch.testing.assert_close(v.cpu(), c)


def _strided(dev, size, stride):
    n = max((s - 1) * st for s, st in zip(size, stride)) + 1
    return torch.arange(n, dtype=torch.float32).to(dev).as_strided(size, stride)


def test_broadcast_inputs_get_tensoriterators_output_layout_whatever_ran_before():
    """Issue 33 A.3: clamp's Meta kernel (a Python reference) orders the output by every input stride, those of
    size-1 dims included, and disagrees with TensorIterator for some expanded layouts. After a pattern where
    they agree had been validated, the other reused Meta's (4, 16, 1) where CPU gives (16, 4, 1)."""
    patterns = [((1, 0, 1), (1, 0, 1)), ((1, 0, 1), (1, 0, 16)), ((1, 0, 16), (1, 0, 1)), ((0, 1, 1), (1, 0, 4))]
    for sa, sl in patterns:
        c, v = (torch.clamp(_strided(d, (4, 4, 1), sa), _strided(d, (4, 4, 1), sl), _strided(d, (4, 4), (1, 0)))
                for d in ("cpu", DEV))
        assert v.stride() == c.stride(), (sa, sl, c.stride(), v.stride())
        assert torch.equal(v.cpu(), c)
    a, b = torch.randn(6, 4).t(), torch.randn(4, 6)  # div with rounding on transposed inputs
    for mode in ("floor", "trunc"):
        c, v = torch.div(a, b, rounding_mode=mode), torch.div(a.to(DEV), b.to(DEV), rounding_mode=mode)
        assert v.stride() == c.stride() and torch.equal(v.cpu(), c)


def _reversed_layout(t):
    """Same shape, dims stored in reverse order (column-major for a matrix batch)."""
    perm = list(range(t.dim()))[::-1]
    return t.permute(perm).contiguous().permute(perm)


@pytest.mark.parametrize("op", [torch.tril, torch.triu])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 1, 3, 3), (3, 4, 5)])
def test_out_in_another_layout_gives_the_functional_result(op, shape):
    """Note [out= tensors in other layouts]: CPU's tril/triu write garbage into (or past the end of) a batched
    column-major out; vnpu gives the functional result and keeps out's strides."""
    x = torch.randn(shape)
    out = _reversed_layout(torch.full(shape, float("nan"), device="vnpu"))
    strides = out.stride()
    r = op(x.to("vnpu"), out=out)
    assert r is out and out.stride() == strides
    assert torch.equal(out.cpu(), op(x))


@pytest.mark.parametrize("layout", ["channels_last", "reversed"])
def test_linalg_lu_out_in_another_layout(layout):
    a = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    expected = torch.linalg.lu(a)
    to = ((lambda t: t.contiguous(memory_format=torch.channels_last)) if layout == "channels_last"
          else _reversed_layout)
    outs = tuple(to(torch.empty_like(t, device="vnpu")) for t in expected)
    torch.linalg.lu(a.to("vnpu"), out=outs)
    for o, e in zip(outs, expected):
        torch.testing.assert_close(o.cpu(), e)
    p, l, u = (o.cpu() for o in outs)
    torch.testing.assert_close(p @ l @ u, a)  # the factorization itself, not only CPU's numbers
    lu, piv = torch.linalg.lu_factor(a)
    unpacked = tuple(to(torch.empty_like(t, device="vnpu")) for t in expected)
    torch.lu_unpack(lu.to("vnpu"), piv.to("vnpu"), out=unpacked)
    for o, e in zip(unpacked, expected):
        torch.testing.assert_close(o.cpu(), e)


def test_out_slices_and_batch_norm_out_give_the_functional_result():
    """CPU's narrow_copy/avg_pool3d write wrong elements into a slice out=, and CPU's native_batch_norm.out reads
    its uninitialised save_mean for a non-contiguous input (Note [out= kernels that read their outputs]):
    vnpu gives the functional result."""
    x = torch.randn(5, 6, 5)
    out = torch.full((5, 2, 10), float("nan"), device="vnpu")[..., ::2]  # a slice: gaps between elements
    torch.narrow_copy(x.to("vnpu"), 1, 1, 2, out=out)
    assert torch.equal(out.cpu(), torch.narrow_copy(x, 1, 1, 2))
    inp = torch.randn(2, 3, 4, 4, 4)
    pooled = torch.empty(2, 3, 2, 2, 4, device="vnpu")[..., ::2]
    torch._C._nn.avg_pool3d(inp.to("vnpu"), 2, out=pooled)
    torch.testing.assert_close(pooled.cpu(), F.avg_pool3d(inp, 2))
    x = torch.randn(5, 4, 6).transpose(0, 2)  # (6, 4, 5), channels in dim 1, not contiguous
    w, b = torch.randn(4), torch.randn(4)
    rm, rv = torch.zeros(4), torch.ones(4)
    expected = torch.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5)
    v_rm, v_rv = torch.zeros(4, device="vnpu"), torch.ones(4, device="vnpu")
    outs = [torch.full(t.shape, 7.0, device="vnpu") for t in expected]  # not the mean: a kernel reading it is wrong
    torch.ops.aten.native_batch_norm.out(x.to("vnpu"), w.to("vnpu"), b.to("vnpu"), v_rm, v_rv, True, 0.1, 1e-5,
                                         out=outs[0], save_mean=outs[1], save_invstd=outs[2])
    for o, e in zip(outs, expected):
        torch.testing.assert_close(o.cpu(), e)
    torch.testing.assert_close(v_rm.cpu(), rm)
    torch.testing.assert_close(v_rv.cpu(), rv)


def test_a_resized_out_takes_the_kernels_layout_as_on_cpu():
    """A wrong-shape, non-contiguous out= of a linalg op is resized, and CPU's kernel makes it column-major."""
    s = torch.randn(3, 3, dtype=torch.float64) + 3 * torch.eye(3, dtype=torch.float64)
    b = torch.randn(3, 2, dtype=torch.float64)
    outs = {}
    for d in ("cpu", "vnpu"):
        o = torch.zeros(4, 2, dtype=torch.float64, device=d).t()
        with pytest.warns(UserWarning, match="resized"):
            torch.linalg.solve(s.to(d), b.to(d), out=o)
        outs[d] = o
    assert outs["vnpu"].shape == (3, 2) and outs["vnpu"].stride() == outs["cpu"].stride()
    torch.testing.assert_close(outs["vnpu"].cpu(), outs["cpu"])
