"""Cost of port mode (torch_vnpu.port): the same vnpu work without and with the CUDA-to-vnpu mapping.

Port mode routes every torch call through a Python TorchFunctionMode (it rewrites "cuda" device arguments).
For each case the loop runs --iters times after a warm-up, --repeats times, median reported, in one process:
first plain vnpu, then with port mode enabled (device="cuda" in the port column, "vnpu" in the plain one).

  add_2x2      torch.add(a, b) on 2x2 float32 (host µs per call: the dispatch cost a Python loop pays)
  factory      torch.empty(16, device=...) (a device argument to rewrite)
  gpt_step     one training step of a 2-layer GPT (examples' size: batch 8, block 64, width 128), forward +
               backward + AdamW, ms per step including synchronize

Writes OUT/port_overhead.json and prints a table with the load average.

    python benchmarks/port_overhead.py --out out/bench [--iters 2000 --repeats 5]
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

import _meta


def cases(device: str):
    a, b = torch.randn(2, 2, device=device), torch.randn(2, 2, device=device)
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(128, 4, 512, dropout=0.0, batch_first=True)
    model = torch.nn.Sequential(layer, torch.nn.TransformerEncoderLayer(128, 4, 512, dropout=0.0, batch_first=True))
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, 64, 128, device=device)

    def step():
        loss = F.mse_loss(model(x), x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return {
        "add_2x2": (lambda: torch.add(a, b), 1e6, "µs/call"),
        "factory": (lambda: torch.empty(16, device=device), 1e6, "µs/call"),
        "gpt_step": (step, 1e3, "ms/step"),
    }


def measure(fn, iters: int, repeats: int, scale: float) -> float:
    for _ in range(max(2, iters // 10)):
        fn()
    torch.vnpu.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.vnpu.synchronize()
        times.append((time.perf_counter() - t0) / iters * scale)
    return statistics.median(times)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out/bench")
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    run_meta = _meta.begin(__file__, argv)
    args = p.parse_args(argv)
    iters = {"add_2x2": args.iters, "factory": args.iters, "gpt_step": max(3, args.iters // 200)}
    results = {}
    plain = cases("vnpu")
    for name, (fn, scale, unit) in plain.items():
        results[name] = {"unit": unit, "plain": measure(fn, iters[name], args.repeats, scale)}
    import torch_vnpu.port.cuda  # noqa: F401  (port mode from here on)

    ported = cases("cuda")
    for name, (fn, scale, _) in ported.items():
        results[name]["port"] = measure(fn, iters[name], args.repeats, scale)
        results[name]["ratio"] = results[name]["port"] / results[name]["plain"]
    load = os.getloadavg()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "port_overhead.json"), "w") as f:
        json.dump({"run": _meta.end(run_meta), "results": results, "loadavg": load, "iters": iters,
                   "repeats": args.repeats}, f, indent=1)
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'case':10} {'unit':8} {'vnpu':>10} {'port mode':>10} {'ratio':>7}")
    for name, r in results.items():
        print(f"{name:10} {r['unit']:8} {r['plain']:10.2f} {r['port']:10.2f} {r['ratio']:7.2f}")


if __name__ == "__main__":
    main()
