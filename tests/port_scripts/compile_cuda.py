"""A CUDA training script that compiles its model, as nanoGPT's ``compile = True`` does: ``device = "cuda"``,
``model.cuda()``, ``torch.compile(model)``, batches moved with ``.to(device, non_blocking=True)``, a
``torch.arange(..., device=device)`` inside the compiled forward, fused AdamW when on CUDA. Run unedited by
tests/test_port.py under ``python -m torch_vnpu.port.run``; ``--cpu`` is the CPU run (``--no-compile`` eager),
``--mode reduce-overhead`` compiles with CUDA graphs (then each step starts with ``cudagraph_mark_step_begin()``).
Writes a JSON report to --out.
"""
import argparse
import json

import torch
import torch.nn.functional as F


class Net(torch.nn.Module):
    def __init__(self, device):
        super().__init__()
        self.device = device
        self.pos = torch.nn.Embedding(8, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x):  # x: (batch, 8, 16)
        # A device string of the script's own inside the compiled code.
        x = x + self.pos(torch.arange(x.shape[1], device=self.device))
        return self.fc2(F.gelu(self.fc1(self.norm(x)))).mean(1)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--mode", default=None, help="torch.compile mode, e.g. reduce-overhead (CUDA graphs)")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    torch.manual_seed(0)
    model = Net(device)
    model = model.cuda() if device == "cuda" else model.to(device)
    compiled = model if args.no_compile else torch.compile(model, mode=args.mode)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=device == "cuda")
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(args.steps, 16, 8, 16, generator=g), torch.randint(0, 4, (args.steps, 16), generator=g)
    losses = []
    for step in range(args.steps):
        if args.mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        xb, yb = x[step].to(device, non_blocking=True), y[step].to(device, non_blocking=True)
        logits = compiled(xb)
        loss = F.cross_entropy(logits, yb)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    if device == "cuda":
        torch.cuda.synchronize()
    from torch._dynamo.utils import counters

    report = {
        "device": device,
        "losses": losses,
        "logits_device": str(logits.device),
        "param_devices": sorted({p.device.type for p in model.parameters()}),
        "params": {k: v.detach().cpu().flatten().tolist() for k, v in model.state_dict().items()},
        "frames_ok": counters["frames"]["ok"],
        "unique_graphs": counters["stats"]["unique_graphs"],
        "graph_breaks": sum(counters["graph_break"].values()),
        # Inductor compiled (or loaded from its cache) the forward and backward graphs: not an eager fallback.
        "inductor_graphs": counters["inductor"]["fxgraph_cache_miss"] + counters["inductor"]["fxgraph_cache_hit"],
    }
    if args.mode == "reduce-overhead":
        from torch._inductor import cudagraph_trees

        def recorded(nodes):
            return sum(1 + recorded([c for cs in n.children.values() for c in cs]) for n in nodes)

        manager = cudagraph_trees.get_manager(0, create_if_none_exists=False)
        report["graph_recordings"] = recorded([n for ns in manager.roots.values() for n in ns]) if manager else 0
        report["cudagraph_skips"] = counters["inductor"]["cudagraph_skips"]
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f)
    return report


if __name__ == "__main__":
    main()
