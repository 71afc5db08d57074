"""A nanoGPT-style training loop written for CUDA (the shape of nanoGPT's train.py: device='cuda',
device_type from a string test, torch.cuda.is_bf16_supported(), torch.cuda.amp.GradScaler, autocast with a
dtype, pin_memory + non_blocking copies, fused AdamW only when device_type == 'cuda'). Used unedited by
tests/test_port.py under ``python -m torch_vnpu.port.run``; ``--device=cpu`` is the CPU run.

Overrides: --key=value (as nanoGPT's configurator). Writes a JSON report to --out.
"""
import inspect
import json
import math
import sys
from contextlib import nullcontext

import torch
import torch.nn as nn
from torch.nn import functional as F

# -----------------------------------------------------------------------------
out = "nanogpt.json"
device = "cuda"
dtype = "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float16"
batch_size = 4
block_size = 16
n_layer = 2
n_head = 2
n_embd = 32
vocab_size = 64
max_iters = 6
learning_rate = 1e-3
weight_decay = 1e-1
beta1, beta2 = 0.9, 0.95
grad_clip = 1.0
for arg in sys.argv[1:]:
    key, val = arg[2:].split("=", 1)
    globals()[key] = type(globals()[key])(val) if not isinstance(globals()[key], str) else val
# -----------------------------------------------------------------------------


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(n_embd, dim=2)
        q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(n_embd), CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, n_embd), nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight

    def forward(self, idx, targets):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        fused_available = "fused" in inspect.signature(torch.optim.AdamW).parameters
        use_fused = fused_available and device_type == "cuda"
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **({"fused": True} if use_fused else {}))


torch.manual_seed(1337)
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
device_type = "cuda" if "cuda" in device else "cpu"
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type=device_type, dtype=ptdtype)

data = (torch.arange(2000) * 7 % vocab_size).long()  # a deterministic token stream
gen = torch.Generator().manual_seed(0)


def get_batch():
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=gen)
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    if device_type == "cuda":
        x, y = x.pin_memory(), y.pin_memory()
        facts["pinned"] = x.is_pinned() and y.is_pinned()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    else:
        x, y = x.to(device), y.to(device)
    return x, y


facts = {"dtype": dtype, "device_type": device_type}
model = GPT()
model.to(device)
scaler = torch.cuda.amp.GradScaler(enabled=(dtype == "float16"))
optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)
losses = []
X, Y = get_batch()
for it in range(max_iters):
    lr = learning_rate * 0.5 * (1.0 + math.cos(math.pi * it / max_iters))
    for group in optimizer.param_groups:
        group["lr"] = lr
    with ctx:
        logits, loss = model(X, Y)
    facts["logits_dtype"] = str(logits.dtype)
    X, Y = get_batch()
    scaler.scale(loss).backward()
    if grad_clip != 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    losses.append(loss.item())
if device_type == "cuda":
    torch.cuda.synchronize()
    facts["max_memory_allocated"] = torch.cuda.max_memory_allocated()

facts.update(
    losses=losses,
    param_devices=sorted({p.device.type for p in model.parameters()}),
    fused=bool(optimizer.defaults.get("fused")),
    scaler_enabled=scaler.is_enabled(),
    scaler_device=getattr(scaler, "_device", None),
    scale=scaler.get_scale() if scaler.is_enabled() else None,
    cuda_available=torch.cuda.is_available(),
    x_device=str(X.device),
    x_is_cuda=X.is_cuda,
)
with open(out, "w") as f:
    json.dump(facts, f)
print(json.dumps(facts))
