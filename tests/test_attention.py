"""scaled_dot_product_attention on vnpu (Note [vnpu's fused attention is CUDA's efficient attention] in
csrc/ops/FusedAttention.cpp): where CPU runs its flash kernel, vnpu runs the op CUDA runs for float32 and masks,
``_scaled_dot_product_efficient_attention``, computed by CPU's flash kernel. Oracle: CPU's results, bit for bit
(the same kernel), forward and gradients; the op each case reaches, seen by a TorchDispatchMode."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func._overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _cuda_layout(out):
    """Strides of efficient attention's output on CUDA (and of its Meta kernel): [B, L, H, D] viewed as
    [B, H, L, D]."""
    B, H, L, D = out.shape
    return (L * H * D, D, H * D, 1)


def _qkv(B=2, H=3, L=37, S=45, D=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, D, generator=g).to(dtype) for n in (L, S, S)]


def _run(dev, q, k, v, grad_out=None, **kw):
    leaves = [t.detach().to(dev).clone().requires_grad_() for t in (q, k, v)]
    kw = {a: b.to(dev) if isinstance(b, torch.Tensor) else b for a, b in kw.items()}
    with _Ops() as mode:
        out = F.scaled_dot_product_attention(*leaves, **kw)
        out.backward(grad_out.to(dev))
    return [t.detach().cpu() for t in (out, *(x.grad for x in leaves))], set(mode.ops)


MASKS = {
    "none": lambda L, S, dtype: {},
    "causal": lambda L, S, dtype: {"is_causal": True},
    "bool": lambda L, S, dtype: {"attn_mask": torch.rand(L, S, generator=torch.Generator().manual_seed(1)) > 0.3},
    "float_broadcast": lambda L, S, dtype: {"attn_mask": torch.randn(2, 1, L, S).to(dtype), "scale": 0.3},
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mask", list(MASKS))
def test_fused_attention_is_efficient_attention_with_cpu_results(dtype, mask):
    q, k, v = _qkv(dtype=dtype)
    kw = MASKS[mask](37, 45, dtype)
    grad_out = torch.randn(2, 3, 37, 16).to(dtype)
    got, ops = _run("vnpu", q, k, v, grad_out, **kw)
    ref, ref_ops = _run("cpu", q, k, v, grad_out, **kw)
    assert "_scaled_dot_product_flash_attention_for_cpu" in ref_ops  # the kernel CPU picks for these inputs
    assert {"_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward"} <= ops
    assert "_scaled_dot_product_flash_attention_for_cpu" not in ops  # what tensor/context parallelism cannot shard
    for a, b in zip(got, ref):
        assert torch.equal(a, b)
    assert got[0].stride() == _cuda_layout(got[0])  # the output in efficient attention's (CUDA's) layout
    assert all(a.stride() == b.stride() for a, b in zip(got[1:], ref[1:]))  # gradients as CPU's


def test_cpu_choice_stands_for_float64_gqa_dropout_and_a_mask_that_requires_grad():
    q, k, v = _qkv(dtype=torch.float64)
    got, ops = _run("vnpu", q, k, v, torch.ones(2, 3, 37, 16, dtype=torch.float64))
    ref, _ = _run("cpu", q, k, v, torch.ones(2, 3, 37, 16, dtype=torch.float64))
    assert "_scaled_dot_product_flash_attention_for_cpu" in ops and all(torch.equal(a, b) for a, b in zip(got, ref))
    # grouped-query attention: 6 query heads over 3 key/value heads
    q6 = torch.randn(2, 6, 37, 16)
    got, ops = _run("vnpu", q6, k.float(), v.float(), torch.ones(2, 6, 37, 16), enable_gqa=True)
    ref, _ = _run("cpu", q6, k.float(), v.float(), torch.ones(2, 6, 37, 16), enable_gqa=True)
    assert "_scaled_dot_product_efficient_attention" not in ops and all(torch.equal(a, b) for a, b in zip(got, ref))
    # a mask that requires grad: its gradient as CPU computes it
    mask = torch.randn(37, 45)
    res = {}
    for dev in ("cpu", "vnpu"):
        m = mask.detach().to(dev).clone().requires_grad_()
        qq, kk, vv = (t.detach().float().to(dev).clone().requires_grad_() for t in (q, k, v))
        F.scaled_dot_product_attention(qq, kk, vv, attn_mask=m).sum().backward()
        res[dev] = [t.grad.cpu() for t in (qq, kk, vv, m)]
    assert all(torch.equal(a, b) for a, b in zip(res["vnpu"], res["cpu"]))
    # dropout in training: CPU's math path, the same random stream on each device is not promised; shape only
    out = F.scaled_dot_product_attention(*(t.float().to("vnpu") for t in (q, k, v)), dropout_p=0.5)
    assert out.shape == (2, 3, 37, 16) and torch.isfinite(out.cpu()).all()


def test_efficient_attention_op_log_sumexp_has_cuda_shape_and_cpu_values():
    q, k, v = _qkv(L=40)
    out, lse, _, _ = aten._scaled_dot_product_efficient_attention(q.to("vnpu"), k.to("vnpu"), v.to("vnpu"), None,
                                                                   True, is_causal=True)
    ref_out, ref_lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=True)[:2]
    assert lse.shape == (2, 3, math.ceil(40 / 32) * 32) and lse.dtype == torch.float32  # as the Meta kernel says
    assert torch.equal(lse.cpu()[..., :40], ref_lse) and torch.equal(out.cpu(), ref_out)
    _, no_lse, _, _ = aten._scaled_dot_product_efficient_attention(q.to("vnpu"), k.to("vnpu"), v.to("vnpu"), None,
                                                                    False)
    assert no_lse.shape == (2, 3, 0)
    with torch.no_grad():  # inference: no log_sumexp computed, output as CPU's
        assert torch.equal(F.scaled_dot_product_attention(q.to("vnpu"), k.to("vnpu"), v.to("vnpu")).cpu(),
                           F.scaled_dot_product_attention(q, k, v))


def test_efficient_attention_backward_without_log_sumexp_raises_clearly():
    q, k, v = (t.to("vnpu") for t in _qkv(L=8, S=8))
    out, no_lse, seed, offset = aten._scaled_dot_product_efficient_attention(q, k, v, None, False)
    with pytest.raises(RuntimeError, match="compute_log_sumexp=False"):
        aten._scaled_dot_product_efficient_attention_backward(out, q, k, v, None, out, no_lse, seed, offset, 0.0,
                                                              [True, True, True, False])
    assert torch.equal((q + 1).cpu(), q.cpu() + 1)  # the device stays usable


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_compiled_attention_with_several_heads_equals_cpu(layout):
    """torch.compile checks a fallback kernel's output strides against its Meta kernel: efficient attention's
    output must have CUDA's layout whatever the query's (a contiguous multi-head query failed with
    "expected size 2==2, stride 128==8")."""
    g = torch.Generator().manual_seed(3)
    if layout == "contiguous":
        q = torch.randn(2, 4, 16, 8, generator=g)
    else:
        q = torch.randn(2, 16, 4, 8, generator=g).transpose(1, 2)
    fn = torch.compile(lambda a: F.scaled_dot_product_attention(a, a * 0.5, a, is_causal=True).square().sum())
    leaf = q.to("vnpu").requires_grad_()
    loss = fn(leaf)
    loss.backward()
    ref_leaf = q.clone().requires_grad_()
    ref = F.scaled_dot_product_attention(ref_leaf, ref_leaf * 0.5, ref_leaf, is_causal=True).square().sum()
    ref.backward()
    torch.testing.assert_close(loss.cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(leaf.grad.cpu(), ref_leaf.grad, rtol=1e-5, atol=1e-5)


def test_backend_switches_choose_as_on_cuda():
    """sdpa_kernel / torch.backends.cuda.enable_*_sdp select vnpu's kernels as CUDA's: EFFICIENT_ATTENTION alone
    runs efficient attention (it raised "No viable backend"), FLASH_ATTENTION alone or efficient disabled runs
    CPU's flash op, MATH the math path; results equal to CPU's."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = _qkv(L=16, S=16)
    ref = F.scaled_dot_product_attention(q, k, v)
    qv, kv, vv = (t.to("vnpu") for t in (q, k, v))
    expected = {SDPBackend.EFFICIENT_ATTENTION: "_scaled_dot_product_efficient_attention",
                SDPBackend.FLASH_ATTENTION: "_scaled_dot_product_flash_attention_for_cpu",
                SDPBackend.MATH: None}  # a composite: decomposed before it reaches the dispatch mode
    fused = {"_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention_for_cpu"}
    for backend, op in expected.items():
        with sdpa_kernel(backend), _Ops() as mode:
            out = F.scaled_dot_product_attention(qv, kv, vv)
        assert (op in mode.ops) if op else not fused & set(mode.ops), (backend, mode.ops)
        torch.testing.assert_close(out.cpu(), ref, rtol=1e-6, atol=1e-6)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    try:
        with _Ops() as mode:
            F.scaled_dot_product_attention(qv, kv, vv)
        assert "_scaled_dot_product_flash_attention_for_cpu" in mode.ops
    finally:
        torch.backends.cuda.enable_mem_efficient_sdp(True)
