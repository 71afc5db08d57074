"""torch.nn.attention.flex_attention compiled on vnpu, with a score_mod and a block mask from create_block_mask.

Oracles: the same compiled call on CPU tensors (inference: both run Inductor's C++ flex-attention template, so
the results must be bitwise equal), and a dense float64 reference on CPU (scores, score_mod and mask applied
elementwise, softmax, autograd for the gradients; float32 results within 1e-5). torch 2.13 has no compiled (or
eager) flex_attention backward on CPU ("FlexAttention does not support backward on CPU"), so gradients are
checked against the dense reference and, for a causal mask without score_mod, eager sdpa.
"""
import math

import pytest
import torch
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

B, H, L, E = 2, 2, 96, 16
BLOCK = 32  # 3 x 3 blocks: a causal mask skips 3 and computes 3 partially
TOL = dict(rtol=1e-5, atol=1e-5)


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def inputs(requires_grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, L, E, generator=g) for _ in range(3)]


def dense_reference(q, k, v, score_mod, mask_mod):
    """Attention in float64 on CPU with the score_mod and mask_mod applied to broadcast index tensors."""
    q, k, v = (t.double() for t in (q, k, v))
    b = torch.arange(q.size(0)).view(-1, 1, 1, 1)
    h = torch.arange(q.size(1)).view(1, -1, 1, 1)
    qi = torch.arange(q.size(2)).view(1, 1, -1, 1)
    ki = torch.arange(k.size(2)).view(1, 1, 1, -1)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    if score_mod is not None:
        scores = score_mod(scores, b, h, qi, ki)
    scores = scores.masked_fill(~mask_mod(b, h, qi, ki), -math.inf)
    return torch.softmax(scores, dim=-1) @ v


def test_block_mask_on_vnpu_matches_cpu():
    bm_v = create_block_mask(causal, None, None, L, L, device="vnpu", BLOCK_SIZE=BLOCK)
    bm_c = create_block_mask(causal, None, None, L, L, device="cpu", BLOCK_SIZE=BLOCK)
    assert bm_v.kv_num_blocks.device.type == "vnpu"
    for a, b in zip(bm_v.as_tuple()[2:-1], bm_c.as_tuple()[2:-1]):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a.cpu(), b)
    assert bm_v.sparsity() == bm_c.sparsity() > 0


def test_compiled_inference_matches_compiled_cpu_bitwise_and_the_dense_reference():
    def score_mod(score, b, h, q_idx, kv_idx):
        return score + (q_idx - kv_idx) * 0.05 + h

    f = torch.compile(flex_attention)
    q, k, v = inputs()
    with torch.no_grad():
        out_c = f(q, k, v, score_mod=score_mod,
                  block_mask=create_block_mask(causal, None, None, L, L, device="cpu", BLOCK_SIZE=BLOCK))
        bm = create_block_mask(causal, None, None, L, L, device="vnpu", BLOCK_SIZE=BLOCK)
        out_v, codes = run_and_get_code(f, *(t.to("vnpu") for t in (q, k, v)), score_mod=score_mod, block_mask=bm)
    assert out_v.device.type == "vnpu"
    assert torch.equal(out_v.cpu(), out_c)
    torch.testing.assert_close(out_v.cpu(), dense_reference(q, k, v, score_mod, causal).float(), **TOL)
    # CPU's C++ flex-attention template, launched as a vnpu kernel
    code = "\n".join(codes)
    assert "cpp_fused_flex_attention_0 = vnpu_cpp_pybinding(" in code
    assert "cpp_fused_flex_attention_0('cpp_fused_flex_attention_0 (compiled graph" in code
    # Grad enabled but no input requires grad: nothing uses the log-sum-exp, so the template serves it too.
    out_g, codes = run_and_get_code(f, *(t.to("vnpu") for t in (q, k, v)), score_mod=score_mod, block_mask=bm)
    assert torch.equal(out_g.cpu(), out_c)
    assert "cpp_fused_flex_attention_0 = vnpu_cpp_pybinding(" in "\n".join(codes)


def test_eager_flex_attention_on_vnpu_matches_cpu():
    def score_mod(score, b, h, q_idx, kv_idx):
        return score * 0.5 + (q_idx - kv_idx) * 0.05

    q, k, v = inputs()
    with torch.no_grad():
        out_c = flex_attention(q, k, v, score_mod=score_mod,
                               block_mask=create_block_mask(causal, None, None, L, L, device="cpu", BLOCK_SIZE=BLOCK))
        out_v = flex_attention(*(t.to("vnpu") for t in (q, k, v)), score_mod=score_mod,
                               block_mask=create_block_mask(causal, None, None, L, L, device="vnpu", BLOCK_SIZE=BLOCK))
    assert torch.equal(out_v.cpu(), out_c)


def test_compiled_training_matches_dense_reference_and_sdpa():
    bias = torch.randn(H, generator=torch.Generator().manual_seed(1))

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + bias_v[h] * (q_idx - kv_idx) * 0.01

    q, k, v = inputs()
    bias_v = bias.to("vnpu").requires_grad_()
    qv, kv, vv = (t.to("vnpu").requires_grad_() for t in (q, k, v))
    bm = create_block_mask(causal, None, None, L, L, device="vnpu", BLOCK_SIZE=BLOCK)
    f = torch.compile(flex_attention)
    out = f(qv, kv, vv, score_mod=score_mod, block_mask=bm)
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    out.backward(go.to("vnpu"))

    qr, kr, vr, br = (t.double().requires_grad_() for t in (q, k, v, bias))

    def score_mod_ref(score, b, h, q_idx, kv_idx):
        return score + br[h] * (q_idx - kv_idx) * 0.01

    ref = dense_reference(qr, kr, vr, score_mod_ref, causal)
    ref.backward(go.double())
    torch.testing.assert_close(out.detach().cpu(), ref.float(), **TOL)
    for got, want in [(qv, qr), (kv, kr), (vv, vr), (bias_v, br)]:
        torch.testing.assert_close(got.grad.cpu(), want.grad.float(), **TOL)

    # Causal mask without score_mod: eager sdpa on CPU is a second oracle.
    for t in (qv, kv, vv):
        t.grad = None
    out = f(qv, kv, vv, block_mask=bm)
    out.backward(go.to("vnpu"))
    qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
    ref.backward(go)
    torch.testing.assert_close(out.detach().cpu(), ref, **TOL)
    for got, want in [(qv, qs), (kv, ks), (vv, vs)]:
        torch.testing.assert_close(got.grad.cpu(), want.grad, **TOL)


def test_compiled_module_training_step_on_a_side_stream():
    """A compiled attention block trained on a side stream: flex_attention's kernels follow the current stream."""

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(E * H, 3 * E * H)

        def forward(self, x, block_mask):
            q, k, v = self.qkv(x).view(x.size(0), L, 3, H, E).permute(2, 0, 3, 1, 4)
            return flex_attention(q, k, v, block_mask=block_mask).transpose(1, 2).reshape(x.shape)

    torch.manual_seed(0)
    cpu = Block()
    dev = Block().to("vnpu")
    dev.load_state_dict(cpu.state_dict())
    x = torch.randn(B, L, E * H)
    s = torch.vnpu.Stream()
    step = torch.compile(dev)
    bm = create_block_mask(causal, None, None, L, L, device="vnpu", BLOCK_SIZE=BLOCK)
    with torch.vnpu.stream(s):
        xv = x.to("vnpu")
        step(xv, bm).square().sum().backward()
    s.synchronize()
    # CPU reference: the same block with sdpa (causal)
    q, k, v = cpu.qkv(x).view(B, L, 3, H, E).permute(2, 0, 3, 1, 4)
    F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(x.shape).square().sum().backward()
    torch.testing.assert_close(dev.qkv.weight.grad.cpu(), cpu.qkv.weight.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dev.qkv.bias.grad.cpu(), cpu.qkv.bias.grad, rtol=1e-4, atol=1e-5)
