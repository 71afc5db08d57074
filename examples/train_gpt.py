"""Train a small character-level GPT on the Python standard library's source, on vnpu or cpu.

The one-line device switch: everything below is ordinary PyTorch; only ``--device`` changes.

Data: the source text of a fixed list of standard-library modules (STDLIB_FILES, read from this
interpreter's stdlib directory), concatenated; the first 90% is the training split, the rest validation.
Model: 4 layers, 4 heads, width 128, context 128, dropout 0 (so cpu and vnpu runs are comparable step by step).

With --compile the model (forward and backward, through AOTAutograd) and the optimizer step are compiled
with torch.compile (Inductor): on vnpu its fused C++ kernels run on the current vnpu stream, like eager ops.

Examples:
    python examples/train_gpt.py --device vnpu --steps 200 --out out/
    python examples/train_gpt.py --compare --steps 100 --out out/   # cpu and vnpu, one chart
    python examples/train_gpt.py --device vnpu --compile --steps 200 --out out/
    python examples/train_gpt.py --compare --compile --steps 100 --out out/   # eager and compiled vnpu
    python examples/train_gpt.py --device vnpu --resume out/vnpu/ckpt.pt --steps 50 --out out/resumed

Outputs in --out (per run in --compare mode: OUT/cpu and OUT/vnpu, or OUT/vnpu and OUT/vnpu-compiled): losses.json (per-step training
losses, validation losses), loss.png, ckpt.pt (model + optimizer state, saved from the training device).
"""

import argparse
import json
import math
import os
import sysconfig
import time
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

STDLIB_FILES = [
    "argparse.py", "ast.py", "collections/__init__.py", "dataclasses.py", "difflib.py", "enum.py",
    "functools.py", "heapq.py", "inspect.py", "json/decoder.py", "json/encoder.py", "logging/__init__.py",
    "pathlib.py", "random.py", "shutil.py", "string.py", "textwrap.py", "typing.py", "unittest/case.py",
    "tokenize.py",
]


def load_corpus():
    """(train ids, val ids, vocabulary) from the standard-library files, as int64 CPU tensors."""
    root = sysconfig.get_paths()["stdlib"]
    text = "".join(open(os.path.join(root, f), encoding="utf-8").read() for f in STDLIB_FILES)
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.long)
    split = int(0.9 * len(ids))
    return ids[:split], ids[split:], vocab


@dataclass
class GPTConfig:
    vocab_size: int
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.head.weight = self.tok.weight  # weight tying
        for emb in (self.tok, self.pos):  # GPT-2's init; N(0, 1) would start at a loss of ~60
            nn.init.normal_(emb.weight, std=0.02)

    def forward(self, idx, targets=None):
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def get_batch(data, batch_size, block_size, gen):
    """A batch of (inputs, targets) sampled with the CPU generator ``gen`` (identical on every device)."""
    ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=gen)
    x = torch.stack([data[i : i + block_size] for i in ix])
    y = torch.stack([data[i + 1 : i + 1 + block_size] for i in ix])
    return x, y


def build(args, vocab_size, device):
    torch.manual_seed(args.seed)
    model = GPT(GPTConfig(vocab_size=vocab_size)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    return model, opt


@torch.no_grad()
def evaluate(model, data, args, device):
    gen = torch.Generator().manual_seed(1234)
    losses = []
    for _ in range(args.eval_batches):
        x, y = get_batch(data, args.batch_size, GPTConfig.block_size, gen)
        losses.append(model(x.to(device), y.to(device))[1])
    return torch.stack(losses).mean().item()


def train(args, device, out_dir, compile=False):
    """Trains on ``device`` (``compile``: torch.compile the model and the optimizer step).

    Returns {"train": [...], "val": [[step, loss], ...], "seconds": float, ...}.
    """
    train_ids, val_ids, vocab = load_corpus()
    model, opt = build(args, len(vocab), device)
    run_model, opt_step = (torch.compile(model), torch.compile(opt.step)) if compile else (model, opt.step)
    label = f"{device}, compiled" if compile else str(device)
    start_step = 0
    if args.resume:
        ckpt = torch.load(args.resume, map_location=device)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        start_step = ckpt["step"]
    gen = torch.Generator().manual_seed(args.seed + start_step)
    losses, val = [], []
    t0 = time.perf_counter()
    bar = tqdm(range(start_step, start_step + args.steps), desc=f"train[{label}]", disable=args.quiet)
    for step in bar:
        x, y = get_batch(train_ids, args.batch_size, model.cfg.block_size, gen)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        _, loss = run_model(x, y)
        loss.backward()
        opt_step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        if (step + 1) % args.log_interval == 0:
            bar.set_postfix(loss=f"{loss.item():.4f}")
        if args.eval_interval and (step + 1) % args.eval_interval == 0:
            val.append([step + 1, evaluate(run_model, val_ids, args, device)])
            print(f"[{label}] step {step + 1}: train loss {loss.item():.4f}, val loss {val[-1][1]:.4f}")
    train_losses = torch.stack(losses).cpu().tolist() if losses else []
    seconds = time.perf_counter() - t0
    if not val or val[-1][0] != start_step + args.steps:
        val.append([start_step + args.steps, evaluate(run_model, val_ids, args, device)])
    print(f"[{label}] done: train loss {train_losses[-1]:.4f}, val loss {val[-1][1]:.4f}, {seconds:.1f} s")
    os.makedirs(out_dir, exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": start_step + args.steps,
                "vocab": vocab}, os.path.join(out_dir, "ckpt.pt"))
    result = {"device": label, "train": train_losses, "val": val, "seconds": seconds,
              "start_step": start_step, "compiled": compile}
    with open(os.path.join(out_dir, "losses.json"), "w") as f:
        json.dump(result, f)
    return result


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r, style in zip(results, ("-", "--")):
        steps = range(r["start_step"] + 1, r["start_step"] + 1 + len(r["train"]))
        ax.plot(steps, r["train"], style, label=f"train ({r['device']})")
        ax.plot([s for s, _ in r["val"]], [v for _, v in r["val"]], "o" + style, label=f"val ({r['device']})")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss")
    ax.set_title("char-level GPT on the Python stdlib source")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="vnpu", help="vnpu or cpu (any torch device works)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="out")
    p.add_argument("--compare", action="store_true",
                   help="train on cpu and vnpu with the same seed (with --compile: eager and compiled, on --device)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model and the optimizer step")
    p.add_argument("--resume", default=None, help="checkpoint to resume from (loaded with map_location=device)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--eval-interval", type=int, default=50, help="evaluate every N steps (0: only at the end)")
    p.add_argument("--eval-batches", type=int, default=4)
    p.add_argument("--log-interval", type=int, default=10)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)

    if not args.compare:
        r = train(args, torch.device(args.device), args.out, compile=args.compile)
        plot([r], os.path.join(args.out, "loss.png"))
        if torch.device(args.device).type == "vnpu":
            print("fallback ops:", torch.vnpu.get_fallback_ops() or "none")
        return r

    if args.compile:  # eager vs compiled on one device
        device = torch.device(args.device)
        runs = [(device, os.path.join(args.out, device.type), False),
                (device, os.path.join(args.out, f"{device.type}-compiled"), True)]
    else:  # cpu vs vnpu, eager
        runs = [(torch.device(d), os.path.join(args.out, d), False) for d in ("cpu", "vnpu")]
    results = [train(args, d, out, compile=c) for d, out, c in runs]
    first, second = results
    rel = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(first["train"], second["train"]))
    bitwise = first["train"] == second["train"]
    a, b = first["device"], second["device"]
    summary = {"steps": args.steps, "runs": [a, b], "max_rel_diff": rel, "bitwise_equal": bitwise,
               "seconds": [first["seconds"], second["seconds"]],
               "fallback_ops": torch.vnpu.get_fallback_ops(), "extra_copy_ops": torch.vnpu.get_extra_copy_ops()}
    if not args.compile:  # the keys of the cpu vs vnpu comparison
        summary.update(cpu_seconds=first["seconds"], vnpu_seconds=second["seconds"])
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "losses.json"), "w") as f:
        json.dump({"runs": results, "summary": summary, **({} if args.compile else {"cpu": first, "vnpu": second})}, f)
    plot(results, os.path.join(args.out, "loss.png"))
    print(f"{a} vs {b}: max relative loss difference {rel:.3g} over {args.steps} steps "
          f"({'bitwise equal' if bitwise else 'not bitwise equal'}); "
          f"time {a} {first['seconds']:.1f} s, {b} {second['seconds']:.1f} s")
    print("fallback ops:", summary["fallback_ops"] or "none")
    print(f"wrote {args.out}/losses.json and {args.out}/loss.png")
    return summary


if __name__ == "__main__":
    main()
