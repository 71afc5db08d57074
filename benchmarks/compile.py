"""torch.compile on vnpu: GPT training-step time, compile time and recompiles, against Inductor on CPU.

The model, data and optimizer are those of examples/train_gpt.py (4 layers, 4 heads, width 128; batch 16,
context 128; AdamW). One step = get_batch, copy to the device, forward, backward, optimizer step,
zero_grad(set_to_none=True). "compiled" = torch.compile(model) (forward and backward through AOTAutograd)
and torch.compile(opt.step), as `train_gpt.py --compile` does. AdamW runs with foreach=True on both devices
(vnpu's default; CPU defaults to the per-parameter loop), so compiled cpu and compiled vnpu run the same
graphs and kernels. Their losses are not bitwise equal over many steps: the compiled embedding backward adds with
atomic adds across threads, so compiled CPU also differs from itself run to run.

Configurations, each in a process of its own (as a user's job; see benchmarks/train_step.py for why):
  eager cpu, compiled cpu (Inductor on CPU tensors), eager vnpu, compiled vnpu.
Step time: --warmup untimed steps, then --rounds rounds; each round times --steps synced steps on every
configuration in turn (alternating, so drift in the machine's speed hits all alike); medians over all
rounds, and the median of per-round ratios.
Compile time: time to the end of the first step (compilations included) with an empty Inductor cache
("cold", a fresh TORCHINDUCTOR_CACHE_DIR), and again in a new process with the cache the cold run filled
("warm": Dynamo traces again, Inductor's FX graph and kernel caches hit).
Recompiles: a compiled model (forward + backward) fed 10 sequence lengths; Dynamo's count of compiled
graphs and of frame compilations (automatic dynamic shapes: static first, then one symbolic length).

Writes OUT/compile.json and prints a table. Takes ~5-10 min on 2 cores (cold compilations dominate).

    python benchmarks/compile.py --out out/bench [--rounds 5 --steps 5 --warmup 3]
"""

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import _meta
from _procs import receive, run_in_process

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

CONFIGS = [("cpu", False), ("cpu", True), ("vnpu", False), ("vnpu", True)]
LENGTHS = [16, 24, 32, 40, 48, 64, 80, 96, 112, 128]


def label(device, compiled):
    return f"{'compiled' if compiled else 'eager'} {device}"


def _setup(device, compiled, args):
    import torch

    import train_gpt

    if args.threads:
        torch.set_num_threads(args.threads)
    train_ids, _, vocab = train_gpt.load_corpus()
    dev = torch.device(device)
    model, _ = train_gpt.build(argparse.Namespace(seed=args.seed, lr=args.lr), len(vocab), dev)
    # foreach=True everywhere (vnpu's default, not CPU's): compiled cpu and compiled vnpu run the same graphs.
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, foreach=True)
    run_model, opt_step = (torch.compile(model), torch.compile(opt.step)) if compiled else (model, opt.step)
    gen = torch.Generator().manual_seed(args.seed)

    def sync():
        if dev.type == "vnpu":
            torch.vnpu.synchronize(dev)

    def step():
        x, y = train_gpt.get_batch(train_ids, args.batch_size, model.cfg.block_size, gen)
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        _, loss = run_model(x, y)
        loss.backward()
        opt_step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return torch, dev, step, sync


def config_process(device, compiled, args, cache_dir, conn):
    """Times the first step (compilation included), warms up, then times a round per "round" message."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    torch, dev, step, sync = _setup(device, compiled, args)
    t0 = time.perf_counter()
    step()
    sync()
    first = time.perf_counter() - t0
    for _ in range(args.warmup):
        step()
    sync()
    conn.send("ready")
    times, losses = [], []
    while conn.recv() == "round":
        for _ in range(args.steps):
            t0 = time.perf_counter()
            loss = step()
            sync()
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
        conn.send("done")
    peak = None
    if dev.type == "vnpu":
        torch.vnpu.reset_peak_memory_stats(dev)
        before = torch.vnpu.memory_allocated(dev)
        step()
        sync()
        peak = {"peak_bytes": torch.vnpu.max_memory_allocated(dev), "persistent_bytes": before}
    conn.send({"first_step_s": first, "step_times_s": times, "losses": losses, "memory": peak,
               "torch_num_threads": torch.get_num_threads()})


def warm_process(device, args, cache_dir, conn):
    """Time to the end of the first compiled step with the cache a cold run filled."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    torch, dev, step, sync = _setup(device, True, args)
    from torch._dynamo.utils import counters

    t0 = time.perf_counter()
    step()
    sync()
    conn.send({"first_step_s": time.perf_counter() - t0, "fx_graph_cache_hit": counters["inductor"]["fxgraph_cache_hit"],
               "fx_graph_cache_miss": counters["inductor"]["fxgraph_cache_miss"]})


def recompile_process(device, args, cache_dir, conn):
    """Forward + backward of the compiled model over LENGTHS; Dynamo's graph and compilation counts."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    import torch
    from torch._dynamo.utils import counters

    import train_gpt

    train_ids, _, vocab = train_gpt.load_corpus()
    dev = torch.device(device)
    model, _ = train_gpt.build(argparse.Namespace(seed=args.seed, lr=args.lr), len(vocab), dev)
    compiled = torch.compile(model)
    gen = torch.Generator().manual_seed(args.seed)
    t0 = time.perf_counter()
    for n in LENGTHS:
        x, y = train_gpt.get_batch(train_ids, args.batch_size, n, gen)
        _, loss = compiled(x.to(dev), y.to(dev))
        loss.backward()
    loss.item()
    conn.send({"lengths": LENGTHS, "graphs": counters["stats"]["unique_graphs"],
               "frame_compilations": counters["frames"]["ok"],
               "seconds": time.perf_counter() - t0})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=5, help="timed steps per configuration and round")
    p.add_argument("--rounds", type=int, default=5, help="rounds of alternating timing")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps after the first")
    p.add_argument("--out", default="out/bench", help="output directory (default: out/bench)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    run_meta = _meta.begin(__file__, argv)
    args = p.parse_args(argv)

    import torch

    load_start = os.getloadavg()
    caches = {d: tempfile.mkdtemp(prefix=f"inductor-{d}-") for d in ("cpu", "vnpu")}
    ctx = multiprocessing.get_context("spawn")
    procs, conns = [], []
    for device, compiled in CONFIGS:  # one at a time: cold compilations do not overlap
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=config_process, daemon=True,
                           args=(device, compiled, args, caches[device], child))
        proc.start()
        receive(parent, proc)
        print(f"[{label(device, compiled)}] ready", flush=True)
        procs.append(proc)
        conns.append(parent)
    for r in range(args.rounds):
        for c, proc in zip(conns, procs):
            c.send("round")
            receive(c, proc)
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    results = {}
    for (device, compiled), c, proc in zip(CONFIGS, conns, procs):
        c.send("finish")
        results[label(device, compiled)] = receive(c, proc)
        proc.join()
    warm = {d: run_in_process(warm_process, d, args, caches[d]) for d in ("cpu", "vnpu")}
    recompiles = {d: run_in_process(recompile_process, d, args, caches[d]) for d in ("cpu", "vnpu")}
    for d in caches.values():
        shutil.rmtree(d, ignore_errors=True)

    k = args.steps
    med = {name: statistics.median(r["step_times_s"]) for name, r in results.items()}

    def paired(a, b):
        ra, rb = results[a]["step_times_s"], results[b]["step_times_s"]
        return statistics.median(statistics.median(ra[i * k:(i + 1) * k]) / statistics.median(rb[i * k:(i + 1) * k])
                                 for i in range(args.rounds))

    losses = {name: r["losses"] for name, r in results.items()}
    summary = {
        "step_ms": {name: m * 1e3 for name, m in med.items()},
        "compiled_vnpu_over_compiled_cpu": med["compiled vnpu"] / med["compiled cpu"],
        "compiled_vnpu_over_compiled_cpu_paired": paired("compiled vnpu", "compiled cpu"),
        "compiled_vnpu_over_eager_vnpu": med["compiled vnpu"] / med["eager vnpu"],
        "compiled_vnpu_over_eager_vnpu_paired": paired("compiled vnpu", "eager vnpu"),
        "eager_vnpu_over_eager_cpu": med["eager vnpu"] / med["eager cpu"],
        "first_step_cold_s": {d: results[label(d, True)]["first_step_s"] for d in ("cpu", "vnpu")},
        "first_step_warm_s": {d: warm[d]["first_step_s"] for d in ("cpu", "vnpu")},
        "first_step_eager_s": {d: results[label(d, False)]["first_step_s"] for d in ("cpu", "vnpu")},
        "recompiles": recompiles,
        "compiled_losses_bitwise_equal_cpu_vnpu": losses["compiled cpu"] == losses["compiled vnpu"],
        "max_rel_loss_diff_compiled_cpu_vs_vnpu": max(
            abs(a - b) / abs(a) for a, b in zip(losses["compiled cpu"], losses["compiled vnpu"])),
        "max_rel_loss_diff_compiled_vs_eager_vnpu": max(
            abs(a - b) / abs(a) for a, b in zip(losses["eager vnpu"], losses["compiled vnpu"])),
        "vnpu_peak_mib": {name: r["memory"]["peak_bytes"] / 2**20 for name, r in results.items() if r["memory"]},
    }
    meta = {"benchmark": "compile", "torch": torch.__version__, "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "torch_num_threads": results["eager cpu"]["torch_num_threads"],
            "loadavg_at_start": load_start, "loadavg_at_end": os.getloadavg(), "steps": args.steps,
            "rounds": args.rounds, "warmup": args.warmup, "batch_size": args.batch_size, "block_size": 128,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "warm_cache_counters": warm}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "compile.json")
    with open(path, "w") as f:
        json.dump({"run": _meta.end(run_meta), "meta": meta, "summary": summary, "results": results}, f, indent=2)

    print(f"\nGPT train step (batch {args.batch_size} x 128, AdamW), {args.rounds} rounds x {args.steps} timed steps "
          f"per configuration after {args.warmup} warm-up; load average {load_start[0]:.2f} -> {os.getloadavg()[0]:.2f}")
    hdr = f"{'configuration':<16}{'step ms':>10}{'first step s':>14}{'warm first s':>14}{'graphs/10 lengths':>19}"
    print(hdr)
    print("-" * len(hdr))
    for device, compiled in CONFIGS:
        name = label(device, compiled)
        warm_s = f"{warm[device]['first_step_s']:.1f}" if compiled else "-"
        graphs = str(recompiles[device]["graphs"]) if compiled else "-"
        print(f"{name:<16}{med[name] * 1e3:>10.1f}{results[name]['first_step_s']:>14.1f}{warm_s:>14}{graphs:>19}")
    print(f"compiled vnpu / compiled cpu: {summary['compiled_vnpu_over_compiled_cpu']:.3f} "
          f"(paired per round: {summary['compiled_vnpu_over_compiled_cpu_paired']:.3f}; target <= 1.05)")
    print(f"compiled vnpu / eager vnpu:   {summary['compiled_vnpu_over_eager_vnpu']:.3f} "
          f"(paired: {summary['compiled_vnpu_over_eager_vnpu_paired']:.3f}; target < 1)")
    print(f"eager vnpu / eager cpu:       {summary['eager_vnpu_over_eager_cpu']:.3f}")
    print(f"compiled losses cpu vs vnpu: {'bitwise equal' if summary['compiled_losses_bitwise_equal_cpu_vnpu'] else 'differ'}; "
          f"compiled vs eager vnpu: max relative difference {summary['max_rel_loss_diff_compiled_vs_eager_vnpu']:.2e}")
    print(f"wrote {path}")
    return summary


if __name__ == "__main__":
    main()
