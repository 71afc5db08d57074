"""Bus bandwidth of collectives: vccl on vnpu tensors vs gloo on CPU tensors, in one run.

For each world size (processes on this host, one vnpu device each, started like torchrun), each
collective and each message size, every rank runs --warmup untimed then N timed back-to-back
operations, then waits for completion (vnpu: Work.wait() + stream synchronize; the timed loop never
blocks the host in between, as a training step would not). The time per operation is the slowest
rank's; bandwidths follow nccl-tests (PERFORMANCE.md):

  algbw = S / t, with S the per-rank message size (all_gather: its output, reduce_scatter: its input)
  busbw = algbw * factor: all_reduce 2(n-1)/n, all_gather and reduce_scatter and all_to_all (n-1)/n,
          broadcast 1 -- the bandwidth each rank's link must sustain, comparable across world sizes.

Both backends run in the same processes ("cpu:gloo,vnpu:vccl", what init_process_group() gives), on
the same sizes, alternating per size. Also measured: the single-thread memcpy bandwidth of this
machine (torch CPU copy_ of 64 MiB with one thread), the reference for shared-memory transports.

Writes OUT/collectives.json and prints a table (GB/s = 1e9 bytes/s).

    python benchmarks/collectives.py --out out/bench                      # 2 and 4 ranks, 4 KiB..256 MiB
    python benchmarks/collectives.py --ranks 2 --ops all_reduce --sizes 64M
"""

import argparse
import json
import os
import platform
import sys
import time

import torch
import torch.distributed as dist

import _meta

OPS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"]
DEFAULT_SIZES = ["4K", "64K", "1M", "16M", "64M", "256M"]


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def human(n):
    for unit, k in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}iB"
    return f"{n} B"


def bus_factor(op, n):
    return {"all_reduce": 2 * (n - 1) / n, "broadcast": 1.0}.get(op, (n - 1) / n)


def memcpy_bandwidth(nbytes=64 << 20, repeats=5):
    """Single-thread copy bandwidth (bytes copied per second), median of `repeats`."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    torch.set_num_threads(prev)
    times.sort()
    return nbytes / times[len(times) // 2]


def _one(op, backend, nbytes, rank, ws, iters, warmup):
    """Seconds per operation on this rank (after a barrier), for `backend` in ("vccl", "gloo")."""
    dev = torch.device("vnpu", torch.vnpu.current_device()) if backend == "vccl" else torch.device("cpu")
    numel = max(1, nbytes // 4)
    if op in ("all_gather",):
        inp = torch.ones(max(1, numel // ws), device=dev)
        out = torch.empty(inp.numel() * ws, device=dev)
        call = lambda: dist.all_gather_into_tensor(out, inp, async_op=True)  # noqa: E731
    elif op == "reduce_scatter":
        numel -= numel % ws
        inp = torch.ones(numel, device=dev)
        out = torch.empty(numel // ws, device=dev)
        call = lambda: dist.reduce_scatter_tensor(out, inp, async_op=True)  # noqa: E731
    elif op == "all_to_all":
        numel -= numel % ws
        inp = torch.ones(numel, device=dev)
        out = torch.empty(numel, device=dev)
        call = lambda: dist.all_to_all_single(out, inp, async_op=True)  # noqa: E731
    elif op == "broadcast":
        t = torch.ones(numel, device=dev)
        call = lambda: dist.broadcast(t, 0, async_op=True)  # noqa: E731
    else:
        t = torch.ones(numel, device=dev)
        call = lambda: dist.all_reduce(t, async_op=True)  # noqa: E731

    def run(n):
        works = [call() for _ in range(n)]
        for w in works:
            w.wait()
        if dev.type == "vnpu":
            torch.vnpu.synchronize()

    run(warmup)
    dist.barrier()  # gloo, on cpu
    t0 = time.perf_counter()
    run(iters)
    return (time.perf_counter() - t0) / iters


def _rank_main(rank, ws, ops, sizes, iters, warmup, budget_s):
    rows = []
    for op in ops:
        for nbytes in sizes:
            # fewer iterations for big messages (keeps each point near `budget_s` seconds)
            for backend in ("vccl", "gloo"):
                probe = torch.tensor([_one(op, backend, nbytes, rank, ws, 1, 1)], dtype=torch.float64)
                dist.all_reduce(probe, op=dist.ReduceOp.MAX)  # every rank must run the same count
                n = max(2, min(iters, int(budget_s / max(probe.item(), 1e-6))))
                secs = _one(op, backend, nbytes, rank, ws, n, warmup)
                worst = torch.tensor([secs], dtype=torch.float64)
                dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # gloo (cpu tensor)
                rows.append({"op": op, "backend": backend, "bytes": nbytes, "ranks": ws, "iters": n,
                             "seconds": worst.item()})
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--ops", nargs="+", default=OPS, choices=OPS)
    p.add_argument("--sizes", nargs="+", default=DEFAULT_SIZES, help="bytes per rank, K/M/G suffixes")
    p.add_argument("--iters", type=int, default=20, help="timed operations per point (fewer for big sizes)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--budget", type=float, default=1.5, help="target seconds per measured point")
    p.add_argument("--out", default="out/bench")
    run_meta = _meta.begin(__file__, argv)
    args = p.parse_args(argv)

    from torch_vnpu.testing.distributed import ProcessWorld

    sizes = [parse_size(s) for s in args.sizes]
    env = {"load_average_start": os.getloadavg(), "cpus": os.cpu_count(), "torch": torch.__version__,
           "python": platform.python_version(), "machine": platform.machine()}
    memcpy = memcpy_bandwidth()
    results = []
    for ws in args.ranks:
        with ProcessWorld(ws, env={"VNPU_DEVICE_COUNT": str(max(2, ws))}, timeout=3600) as w:
            per_rank = w.run(_rank_main, args.ops, sizes, args.iters, args.warmup, args.budget, timeout=3600)
        for row in per_rank[0]:
            algbw = row["bytes"] / row["seconds"]
            row["algbw_GBps"] = algbw / 1e9
            row["busbw_GBps"] = algbw * bus_factor(row["op"], ws) / 1e9
            results.append(row)
    env["load_average_end"] = os.getloadavg()
    report = {"run": _meta.end(run_meta), "env": env, "memcpy_GBps_single_thread": memcpy / 1e9, "results": results}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "collectives.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=1)

    print(f"single-thread memcpy: {memcpy / 1e9:.2f} GB/s; load average {env['load_average_start']} -> "
          f"{env['load_average_end']}; {env['cpus']} CPUs")
    print(f"{'op':<15}{'ranks':>6}{'size':>10}{'vccl busbw':>12}{'gloo busbw':>12}{'vccl/gloo':>10}"
          f"{'vccl us':>11}{'gloo us':>11}{'vccl/memcpy':>12}")
    key = {(r["op"], r["ranks"], r["bytes"], r["backend"]): r for r in results}
    for ws in args.ranks:
        for op in args.ops:
            for nbytes in sizes:
                v, g = key[(op, ws, nbytes, "vccl")], key[(op, ws, nbytes, "gloo")]
                print(f"{op:<15}{ws:>6}{human(nbytes):>10}{v['busbw_GBps']:>12.3f}{g['busbw_GBps']:>12.3f}"
                      f"{v['busbw_GBps'] / g['busbw_GBps']:>10.2f}{v['seconds'] * 1e6:>11.0f}"
                      f"{g['seconds'] * 1e6:>11.0f}{v['busbw_GBps'] * 1e9 / memcpy:>12.2f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
