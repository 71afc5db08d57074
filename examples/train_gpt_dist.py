"""Train the GPT of examples/train_gpt.py on several vnpu devices: DDP, FSDP2, tensor parallel, or FSDP x TP.

One process per device, started by torchrun; collectives go through vccl (init_process_group() with no
backend). Model, data, seed, optimizer (AdamW) and global batch are those of train_gpt.py, so the loss
curve matches the single-process run of train_gpt.py up to float32 reduction order (measured numbers and
tolerance: tests/test_train_gpt_dist.py and docs/benchmarks.md).

    torchrun --nproc-per-node 2 examples/train_gpt_dist.py --parallel ddp --steps 100 --out out/dist-ddp
    torchrun --nproc-per-node 2 examples/train_gpt_dist.py --parallel fsdp --steps 100 --out out/dist-fsdp
    torchrun --nproc-per-node 2 examples/train_gpt_dist.py --parallel tp --steps 100 --out out/dist-tp
    torchrun --nproc-per-node 2 examples/train_gpt_dist.py --device cpu --parallel ddp ...   # CPU + gloo
    VNPU_DEVICE_COUNT=4 torchrun --nproc-per-node 4 examples/train_gpt_dist.py --parallel fsdp+tp --out out/dist-2d
    python examples/train_gpt.py --device vnpu --steps 100 --eval-interval 0 --out out/single  # the reference

  ddp      DistributedDataParallel; each rank trains on its share of the global batch.
  fsdp     FSDP2 fully_shard on every block and the root; parameters, gradients and optimizer state sharded.
  tp       tensor parallel (parallelize_module): q/k/v and the first MLP layer column-wise, the attention and
           MLP output projections row-wise; every rank sees the whole batch, heads are split across ranks.
  fsdp+tp  a 2-D mesh (dp, tp) with --tp ranks per TP group (default 2): TP inside, FSDP2 across.

The attention projections are split into q, k and v (so that heads shard over TP ranks); the weights are
the same numbers as train_gpt.py's fused qkv (copied at start, fused again in the checkpoint).

Outputs of rank 0 in --out: losses.json (global training loss per step, i.e. the mean over the data
parallel ranks, and the final validation loss), ckpt.pt (the full model state on CPU in train_gpt.py's
format: train_gpt.GPT(...).load_state_dict(torch.load(path)["model"]) works on any device).
Progress: a tqdm bar on rank 0.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_gpt  # noqa: E402


class SplitBlock(nn.Module):
    """train_gpt.Block with the fused qkv projection split into q, k, v (same math)."""

    def __init__(self, block: train_gpt.Block):
        super().__init__()
        C = block.qkv.in_features
        self.head_dim = C // block.n_head
        self.ln1, self.ln2, self.proj, self.mlp = block.ln1, block.ln2, block.proj, block.mlp
        self.q, self.k, self.v = (nn.Linear(C, C) for _ in range(3))
        with torch.no_grad():
            for i, m in enumerate((self.q, self.k, self.v)):
                m.weight.copy_(block.qkv.weight[i * C:(i + 1) * C])
                m.bias.copy_(block.qkv.bias[i * C:(i + 1) * C])

    def forward(self, x):
        B, T, _ = x.shape
        h = self.ln1(x)
        # -1: the heads on this rank (all of them, or n_head / tp under tensor parallelism)
        q, k, v = (m(h).view(B, T, -1, self.head_dim).transpose(1, 2) for m in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, -1))
        return x + self.mlp(self.ln2(x))


def fused_state_dict(sd):
    """The state dict of train_gpt.GPT (fused qkv) from one of this script's model (split q/k/v)."""
    out = {}
    for key, value in sd.items():
        name = key.rsplit(".", 2)
        if len(name) == 3 and name[1] in ("q", "k", "v"):
            if name[1] != "q":
                continue
            prefix, param = name[0], name[2]
            out[f"{prefix}.qkv.{param}"] = torch.cat([sd[f"{prefix}.{p}.{param}"] for p in ("q", "k", "v")])
        else:
            out[key] = value
    return out


def tp_plan():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "proj": RowwiseParallel(),
            "mlp.0": ColwiseParallel(), "mlp.2": RowwiseParallel()}


def build(args, vocab_size, device):
    """train_gpt's model (same seed, same initial weights) with split blocks, parallelized; (model, dp rank, dp size)."""
    from torch.distributed.device_mesh import init_device_mesh

    torch.manual_seed(args.seed)
    model = train_gpt.GPT(train_gpt.GPTConfig(vocab_size=vocab_size))
    model.blocks = nn.ModuleList(SplitBlock(b) for b in model.blocks)
    model = model.to(device)
    world = dist.get_world_size()
    if args.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model), dist.get_rank(), world
    if args.parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        # (fully_shard's default mesh is on the accelerator even for a CPU model: name the device)
        mesh = init_device_mesh(device.type, (world,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, dist.get_rank(), world
    from torch.distributed.tensor.parallel import parallelize_module

    if args.parallel == "tp":
        mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("tp",))
        for block in model.blocks:
            parallelize_module(block, mesh["tp"], tp_plan())
        return model, 0, 1
    # fsdp+tp
    from torch.distributed.fsdp import fully_shard

    if world % args.tp:
        raise SystemExit(f"--parallel fsdp+tp: world size {world} is not a multiple of --tp {args.tp}")
    mesh = init_device_mesh(device.type, (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], tp_plan())
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model, mesh.get_local_rank("dp"), mesh["dp"].size()


@torch.no_grad()
def evaluate(model, data, args, device):
    gen = torch.Generator().manual_seed(1234)  # train_gpt.evaluate's batches
    losses = []
    for _ in range(args.eval_batches):
        x, y = train_gpt.get_batch(data, args.batch_size, train_gpt.GPTConfig.block_size, gen)
        losses.append(model(x.to(device), y.to(device))[1])
    return torch.stack(losses).mean().item()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parallel", choices=["ddp", "fsdp", "tp", "fsdp+tp"], default="ddp")
    p.add_argument("--device", choices=["vnpu", "cpu"], default="vnpu",
                   help="cpu: the same job on CPU tensors with the gloo backend (for comparison)")
    p.add_argument("--tp", type=int, default=2, help="ranks per tensor-parallel group (fsdp+tp)")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=16, help="global batch (split over data-parallel ranks)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--eval-batches", type=int, default=4)
    p.add_argument("--out", default="out/dist")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--sync-steps", action="store_true",
                   help="wait for each step's end and record per-step times (benchmarks/dist_train_step.py)")
    args = p.parse_args(argv)

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if args.device == "vnpu":
        torch.vnpu.set_device(local_rank)
        device = torch.device("vnpu", local_rank)
        dist.init_process_group()  # vnpu tensors: vccl (cpu tensors: gloo)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    train_ids, val_ids, vocab = train_gpt.load_corpus()
    model, dp_rank, dp_size = build(args, len(vocab), device)
    if args.batch_size % dp_size:
        raise SystemExit(f"--batch-size {args.batch_size} does not split over {dp_size} data-parallel ranks")
    # Under tp alone the blocks' parameters are DTensors and the rest plain tensors, which the fused
    # (foreach) optimizer implementation cannot mix.
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1,
                            foreach=False if args.parallel == "tp" else None)
    gen = torch.Generator().manual_seed(args.seed)  # the same global batches on every rank (train_gpt's)
    losses, step_seconds = [], []
    t0 = time.perf_counter()
    bar = tqdm(range(args.steps), desc=f"train[{args.parallel} x{dist.get_world_size()}]",
               disable=args.quiet or rank != 0)
    for step in bar:
        x, y = train_gpt.get_batch(train_ids, args.batch_size, train_gpt.GPTConfig.block_size, gen)
        x, y = x.chunk(dp_size)[dp_rank].to(device), y.chunk(dp_size)[dp_rank].to(device)
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        global_loss = loss.detach()
        dist.all_reduce(global_loss, op=dist.ReduceOp.AVG)  # mean over data-parallel shards = whole batch
        losses.append(global_loss)
        if args.sync_steps:  # time each step to its end (the device finished it)
            global_loss.item()
            step_seconds.append(time.perf_counter() - t0 - sum(step_seconds))
        if rank == 0 and (step + 1) % 10 == 0:
            bar.set_postfix(loss=f"{global_loss.item():.4f}")
    train_losses = torch.stack(losses).cpu().tolist() if losses else []
    seconds = time.perf_counter() - t0
    val = evaluate(model, val_ids, args, device)

    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        torch.save({"model": fused_state_dict(full), "step": args.steps, "vocab": vocab},
                   os.path.join(args.out, "ckpt.pt"))
        vccl = dist.group.WORLD._get_backend(device) if device.type == "vnpu" else None
        result = {"parallel": args.parallel, "world_size": dist.get_world_size(), "train": train_losses,
                  "val": val, "seconds": seconds, "step_seconds": step_seconds, "device": args.device,
                  "transport": getattr(vccl, "transport", None)}
        with open(os.path.join(args.out, "losses.json"), "w") as f:
            json.dump(result, f)
        print(f"[{args.parallel} x{dist.get_world_size()}] done: train loss {train_losses[-1]:.4f}, "
              f"val loss {val:.4f}, {seconds:.1f} s (vccl transport: {result['transport']}); "
              f"wrote {args.out}/losses.json and ckpt.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
