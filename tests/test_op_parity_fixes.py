"""Representative cases of the failure kinds the OpInfo sweep found (docs/ops_coverage.md), vs CPU.

Each test stands for a whole kind, fixed in the executor (csrc/ops/Executor.cpp) or its overrides
(csrc/ops/Overrides.cpp): output metadata that depends on bool/int arguments, lazily conjugated results,
out= kernels that re-lay out their output, composites that gate on the device type, CPU's overlap errors.
"""
import functools

import pytest
import torch
import torch.nn.functional as F

DEV = "vnpu"


def _v(x):
    return x.to(DEV) if isinstance(x, torch.Tensor) else x


def _same(out, ref, **tol):
    assert out.device.type == DEV
    assert out.shape == ref.shape and out.dtype == ref.dtype, (out.shape, ref.shape, out.dtype, ref.dtype)
    assert out.is_conj() == ref.is_conj()
    torch.testing.assert_close(out.cpu(), ref, **tol)


def test_batch_norm_eval_outputs_follow_training_flag():
    # The Meta check is keyed by bool arguments too: after a training=True call,
    # training=False must still return CPU's empty save_mean/save_invstd.
    x, w, b = torch.randn(4, 3, 5), torch.randn(3), torch.randn(3)
    rm, rv = torch.zeros(3), torch.ones(3)
    for training in (True, False, True):
        ref = torch.native_batch_norm(x, w, b, rm.clone(), rv.clone(), training, 0.1, 1e-5)
        out = torch.native_batch_norm(_v(x), _v(w), _v(b), _v(rm.clone()), _v(rv.clone()), training, 0.1, 1e-5)
        for o, r in zip(out, ref):
            _same(o, r)


@pytest.mark.parametrize("fn", [F.multi_margin_loss, F.multilabel_margin_loss])
def test_margin_losses_rank_dependent_shapes(fn):
    # 2-D then 1-D input with reduction="none": CPU returns (N,) then () (rank enters the check key).
    for shape in ((3, 4), (4,)):
        x = torch.randn(*shape)
        t = torch.randint(0, 4, shape[:-1]) if fn is F.multi_margin_loss else torch.randint(-1, 4, shape)
        _same(fn(_v(x), _v(t), reduction="none"), fn(x, t, reduction="none"))


def test_lu_solve_lazily_conjugated_result():
    # CPU returns a conj-bit view for adjoint=True, left=False on complex inputs; vnpu must too.
    a, b = torch.randn(3, 3, dtype=torch.complex64), torch.randn(4, 3, dtype=torch.complex64)
    lu, piv = torch.linalg.lu_factor(a)
    ref = torch.linalg.lu_solve(lu, piv, b, adjoint=True, left=False)
    _same(torch.linalg.lu_solve(_v(lu), _v(piv), _v(b), adjoint=True, left=False), ref, rtol=1e-5, atol=1e-5)
    out = torch.empty(4, 3, dtype=torch.complex64, device=DEV)
    torch.linalg.lu_solve(_v(lu), _v(piv), _v(b), adjoint=True, left=False, out=out)
    _same(out, ref, rtol=1e-5, atol=1e-5)


def test_out_kernel_relayout_channels_last_max_unpool():
    # max_unpool2d.out re-lays out its output for channels-last input; the values must land in the
    # layout the caller holds. Poison the allocator's cached blocks first so stale data would show.
    for _ in range(3):
        torch.full((2, 2, 3, 6), float("nan"), device=DEV)
    x = torch.randn(2, 2, 1, 2).contiguous(memory_format=torch.channels_last)
    idx = torch.tensor([[[[1, 10]], [[7, 9]]], [[[6, 17]], [[12, 11]]]]).contiguous(memory_format=torch.channels_last)
    ref = F.max_unpool2d(x, idx, 3, output_size=(3, 6))
    _same(F.max_unpool2d(_v(x), _v(idx), 3, output_size=(3, 6)), ref)


def test_device_gated_composites_run():
    # mode.values and conj_physical_ are composites that dispatch on the device type internally.
    x = torch.randint(0, 3, (4, 7)).float()
    vals, idx = torch.empty(4, device=DEV), torch.empty(4, dtype=torch.long, device=DEV)
    torch.mode(_v(x), 1, out=(vals, idx))
    rv, ri = torch.mode(x, 1)
    _same(vals, rv)
    _same(idx, ri)
    c = torch.randn(5, dtype=torch.complex64)
    _same(_v(c).conj_physical_(), c.clone().conj_physical_())


def test_narrow_copy_error_type_like_cpu():
    x = torch.randn(2, 3)
    with pytest.raises(RuntimeError):
        x.narrow_copy(3, 0, 1)
    with pytest.raises(RuntimeError):
        _v(x).narrow_copy(3, 0, 1)


@pytest.mark.parametrize("case", ["cat_into_input", "index_select_expanded_out", "masked_select_into_input",
                                  "copy_shifted_self", "copy_into_expanded"])
def test_overlap_errors_raise_at_the_call(case):
    def run(dev):
        if case == "cat_into_input":
            x = torch.zeros(12, 6, device=dev)
            torch.cat([x[:6], x[6:]], out=x)
        elif case == "index_select_expanded_out":
            a, out = torch.randn(4, 6, device=dev), torch.empty(1, 6, device=dev).expand(2, 6)
            torch.index_select(a, 0, torch.tensor([0, 1], device=dev), out=out)
        elif case == "masked_select_into_input":
            a = torch.randn(6, device=dev)
            torch.masked_select(a, a > 0, out=a)
        elif case == "copy_shifted_self":
            x = torch.arange(8.0, device=dev)
            x[1:].copy_(x[:-1])
        else:
            x = torch.arange(8.0, device=dev)
            x[:1].expand(3).copy_(torch.ones(3))

    with pytest.raises(RuntimeError, match="unsupported operation") as cpu_err:
        run("cpu")
    with pytest.raises(RuntimeError, match="unsupported operation") as vnpu_err:
        run(DEV)
    assert str(vnpu_err.value).split(".")[0] == str(cpu_err.value).split(".")[0]
    torch.vnpu.synchronize()  # no sticky error was left behind
    y = torch.arange(6.0, device=DEV)
    assert y.add(1).sum().item() == 21.0


def test_in_place_on_itself_still_allowed():
    # Full overlap (x op= x) is legal on CPU and must stay legal (and equal) on vnpu.
    x = torch.randn(5, 4)
    v = _v(x)
    _same(v.mul_(v), x * x)
    x = x * x
    _same(v.add_(v), x + x)


@pytest.mark.parametrize("reduction", [1, 2])  # mean, sum
@pytest.mark.parametrize("op", ["mse_loss", "smooth_l1_loss", "binary_cross_entropy"])
def test_explicit_out_kernels_that_use_out_as_scratch(op, reduction):
    # These out= kernels resize `out` to the input's shape as scratch before reducing into it
    # (Note [Scratch outputs]); device memory cannot grow under a CPU alias, so vnpu reruns on a host copy.
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(4, 5, generator=g), torch.rand(4, 5, generator=g)
    fn = getattr(torch._C._nn, op)
    extra = (None, reduction) if op == "binary_cross_entropy" else (reduction,) + ((1.0,) if op == "smooth_l1_loss" else ())
    ref_out = torch.empty(())
    with pytest.warns(UserWarning, match="resized"):  # CPU warns about the scratch resize as well
        fn(x, y, *extra, out=ref_out)
    out = torch.empty((), device=DEV)
    fn(_v(x), _v(y), *extra, out=out)
    _same(out, ref_out)
    _same(out + 1, ref_out + 1)  # the device stays usable, the value is on the device


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_chunked_linear_cross_entropy_uses_cpu_policy(dtype, reduction):
    # torch picks the chunked path's accumulation dtype from a (device type, dtype) table listing cpu/cuda;
    # vnpu runs CPU's kernels and registers CPU's entries (src/torch_vnpu/patches/cpu_policies.py): fp32 accumulation.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 16, generator=g).to(dtype).requires_grad_()
    w = torch.randn(40, 16, generator=g).to(dtype).requires_grad_()
    t = torch.randint(0, 40, (64,), generator=g)
    opts = torch.nn.LinearCrossEntropyOptions()
    assert opts._adjust(64, 16, 40, dtype, torch.device(DEV)).acc_dtype == torch.float32
    ref = F.linear_cross_entropy(x, w, t, reduction=reduction, options=opts)
    xv, wv = (a.detach().to(DEV).requires_grad_() for a in (x, w))
    out = F.linear_cross_entropy(xv, wv, _v(t), reduction=reduction, options=opts)
    _same(out.detach(), ref.detach(), atol=0, rtol=0)
    ref.sum().backward()
    out.sum().backward()
    _same(xv.grad, x.grad, atol=0, rtol=0)
    _same(wv.grad, w.grad, atol=0, rtol=0)


@pytest.mark.parametrize("case", ["contiguous", "transposed_causal", "float_mask", "bool_mask_scale", "bfloat16"])
def test_sdpa_writes_device_memory_directly_and_equals_cpu(case):
    # _scaled_dot_product_flash_attention_for_cpu (and its backward) has no out= overload; vnpu runs its
    # inner kernel on the outputs it allocated (csrc/ops/OutKernels.cpp): no extra copy, CPU's bits and layouts.
    g = torch.Generator().manual_seed(0)
    B, H, L, D = 2, 4, 16, 8
    dtype = torch.bfloat16 if case == "bfloat16" else torch.float32
    q, k, v = (torch.randn(B, H, L, D, generator=g, dtype=dtype) for _ in range(3))
    kw = {}
    if case == "transposed_causal":
        q, k, v = (torch.randn(B, L, H, D, generator=g).transpose(1, 2) for _ in range(3))
        kw["is_causal"] = True
    elif case == "float_mask":
        kw["attn_mask"] = torch.randn(L, L, generator=g)
    elif case == "bool_mask_scale":
        kw["attn_mask"], kw["scale"] = torch.rand(B, 1, L, L, generator=g) > 0.3, 0.3

    def run(dev):
        leaves = [t.detach().to(dev).clone().requires_grad_() for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*leaves, **{a: _v(b) if dev == DEV else b for a, b in kw.items()})
        out.backward(out.detach() * 0.5 + 1)
        return [t.cpu() for t in (out, *(x.grad for x in leaves))]

    before = torch.vnpu.get_extra_copy_ops()
    got = run(DEV)
    after = torch.vnpu.get_extra_copy_ops()
    ref = run("cpu")
    for a, b in zip(got, ref):
        assert torch.equal(a, b)
    # the output in efficient attention's (CUDA's) layout, the gradients in CPU's (tests/test_attention.py)
    B_, H_, L_, D_ = got[0].shape
    assert got[0].stride() == (L_ * H_ * D_, D_, H_ * D_, 1)
    assert all(a.stride() == b.stride() for a, b in zip(got[1:], ref[1:]))
    assert {op: n - before.get(op, 0) for op, n in after.items() if "scaled_dot_product" in op and
            n != before.get(op, 0)} == {}


def test_sdpa_out_kernel_keeps_cpu_checks():
    q = torch.randn(2, 2, 4, 4)
    with pytest.raises(RuntimeError, match="do not support dropout > 0"):
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, q, q, dropout_p=0.5)
    qv = q.to(DEV)
    with pytest.raises(RuntimeError, match="do not support dropout > 0"):
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qv, qv, qv, dropout_p=0.5)
        torch.vnpu.synchronize()
    assert torch.equal((qv + 1).cpu(), q + 1)  # the device stays usable


def test_source_shape_errors_are_raised_at_the_call_after_a_valid_call():
    """Meta kernels of these ops do not check the source/value shape against the index or mask; after one valid
    call the executor trusted them and the error surfaced one synchronization late as an AcceleratorError.
    CPU raises at the call (Note [Checks Meta kernels lack])."""
    def cases(d):
        def idx(values):
            return torch.tensor(values, device=d)

        ones = functools.partial(torch.ones, device=d)
        return [
            (lambda x, n: x.index_put_((idx([0, 2]),), ones(2, n)), RuntimeError),
            (lambda x, n: x.__setitem__(idx([True, False, True][: 3 if n == 4 else 2]), ones(4)), IndexError),
            (lambda x, n: x.masked_scatter_(ones(3, 4, dtype=torch.bool), ones(12 if n == 4 else 5)), RuntimeError),
            (lambda x, n: x.put_(idx([0, 2]), ones(2 if n == 4 else 3)), IndexError),
            (lambda x, n: x.index_reduce_(0, idx([0, 2]), ones(2, n), "prod"), RuntimeError),
        ]

    for (call, exc), (call_cpu, _) in zip(cases("vnpu"), cases("cpu")):
        call(torch.zeros(3, 4, device="vnpu"), 4)  # valid: warms whatever is cached per op
        torch.vnpu.synchronize()
        x = torch.zeros(3, 4, device="vnpu")
        with pytest.raises(exc):
            call(x, 5)
        torch.vnpu.synchronize()  # nothing left pending
        x_cpu = torch.zeros(3, 4)
        with pytest.raises(exc):
            call_cpu(x_cpu, 5)
        assert torch.equal(x.cpu(), x_cpu)  # what CPU's kernel leaves when it raises (masked_scatter_: a prefix)


def test_histc_of_non_finite_data_raises_at_the_call():
    """With min == max the range comes from the data: CUDA reads it on the host and raises at the call, as CPU
    does; vnpu raised only at the next synchronization."""
    for bad in (float("inf"), float("nan")):
        x = torch.tensor([1.0, bad])
        with pytest.raises(RuntimeError, match="is not finite") as cpu:
            torch.histc(x)
        with pytest.raises(RuntimeError, match="is not finite") as vn:
            torch.histc(x.to("vnpu"))
        assert str(vn.value).splitlines()[0] == str(cpu.value).splitlines()[0]
    torch.vnpu.synchronize()
    # an explicit finite range never looks at the data's range (inf is just outside it)
    y = torch.tensor([1.0, float("inf"), 2.5])
    assert torch.equal(torch.histc(y.to("vnpu"), 4, 0, 3).cpu(), torch.histc(y, 4, 0, 3))
