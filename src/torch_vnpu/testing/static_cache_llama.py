"""A gpt-fast style Llama with a static KV cache, for tests and benchmarks of compiled decoding.

The shape of pytorch-labs/gpt-fast's model.py: the KV cache is written with index_put at ``input_pos``, RoPE,
SDPA with a row of the causal mask, RMSNorm and a SwiGLU MLP; batch 1, float32. ``decode_one_token`` is the
function gpt-fast compiles with ``mode="reduce-overhead", fullgraph=True``.
"""

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Transformer", "decode_one_token"]


class KVCache(nn.Module):
    def __init__(self, heads, max_seq, head_dim):
        super().__init__()
        self.register_buffer("k_cache", torch.zeros(1, heads, max_seq, head_dim))
        self.register_buffer("v_cache", torch.zeros(1, heads, max_seq, head_dim))

    def update(self, input_pos, k, v):
        self.k_cache[:, :, input_pos] = k
        self.v_cache[:, :, input_pos] = v
        return self.k_cache, self.v_cache


def apply_rope(x, freqs):
    xs = x.reshape(*x.shape[:-1], -1, 2)
    f = freqs.view(1, xs.size(1), 1, xs.size(3), 2)
    out = torch.stack([xs[..., 0] * f[..., 0] - xs[..., 1] * f[..., 1],
                       xs[..., 1] * f[..., 0] + xs[..., 0] * f[..., 1]], -1)
    return out.flatten(3)


class Block(nn.Module):
    def __init__(self, dim, heads, hidden, max_seq):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.wqkv = nn.Linear(dim, 3 * dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.w1, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.n1, self.n2 = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.kv_cache = KVCache(heads, max_seq, self.head_dim)

    def forward(self, x, freqs, mask, input_pos):
        b, s, _ = x.shape
        q, k, v = self.wqkv(self.n1(x)).split(self.heads * self.head_dim, dim=-1)
        q, k, v = (t.view(b, s, self.heads, self.head_dim) for t in (q, k, v))
        q, k = apply_rope(q, freqs), apply_rope(k, freqs)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        k, v = self.kv_cache.update(input_pos, k, v)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        h = x + self.wo(y.transpose(1, 2).reshape(b, s, -1))
        z = self.n2(h)
        return h + self.w2(F.silu(self.w1(z)) * self.w3(z))


class Transformer(nn.Module):
    """``layers`` blocks of width ``dim``; ``forward(idx, input_pos)`` takes token ids (1, s) at positions
    ``input_pos`` (s,) and returns logits (1, s, vocab), writing the KV cache at those positions."""

    def __init__(self, vocab=97, dim=64, layers=2, heads=4, hidden=128, max_seq=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads, hidden, max_seq) for _ in range(layers))
        self.norm, self.out = nn.RMSNorm(dim), nn.Linear(dim, vocab, bias=False)
        d = dim // heads
        t = torch.outer(torch.arange(max_seq).float(), 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d)))
        self.register_buffer("freqs", torch.stack([t.cos(), t.sin()], -1))
        self.register_buffer("causal", torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool)))

    def forward(self, idx, input_pos):
        mask = self.causal[None, None, input_pos]
        freqs = self.freqs[input_pos]
        x = self.emb(idx)
        for layer in self.layers:
            x = layer(x, freqs, mask, input_pos)
        return self.out(self.norm(x))


def decode_one_token(model, x, input_pos):
    """The greedy next token (1, 1) after ``x`` (1, s) at ``input_pos`` (s,)."""
    return torch.argmax(model(x, input_pos)[:, -1], dim=-1, keepdim=True)
