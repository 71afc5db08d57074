"""Eager dispatch overhead of small ops: vnpu vs cpu.

For each op (torch.add on 2x2 float32, a 64x64 float32 matmul, ...) and each device, the op is called
--iters times in a loop after a warm-up; this is repeated --repeats times and the median is reported.

  host µs/call  time of the loop alone. On vnpu this is the time to check arguments, infer output
                metadata, allocate outputs and enqueue the kernel; kernels run asynchronously on the
                stream's worker thread, so it is what a Python training loop pays per op.
  e2e µs/call   the loop plus a final synchronize (every queued kernel has run). On cpu host == e2e.

--modes measures the same loops with instrumentation on (issue 11), each mode in turn per op:
  off             nothing on (the default, and the only mode without --modes)
  profiler        inside torch.profiler.profile(activities=[CPU, PrivateUse1]) (cpu: [CPU]); only the
                  loops are timed, not the profiler's start, stop or trace processing
  memory_history  torch.vnpu.memory._record_memory_history() with its defaults (context="all",
                  stacks="all", as CUDA's); cpu has no such recording and runs as off
The table then gives each mode's vnpu host µs/call and its ratio to the off mode of the same run.

Writes OUT/eager_overhead.json (with --modes: OUT/eager_overhead_modes.json) and prints a table.

    python benchmarks/eager_overhead.py --out out/bench [--iters 2000 --repeats 7 --warmup 200]
    nice -n 10 python benchmarks/eager_overhead.py --modes off,profiler,memory_history --iters 500 --repeats 5
"""

import argparse
import contextlib
import json
import os
import platform
import statistics
import time

import torch

import _meta


def make_ops(device):
    """name -> (description, zero-arg callable issuing one call on `device`)."""
    g = torch.Generator().manual_seed(0)
    a2, b2 = (torch.randn(2, 2, generator=g).to(device) for _ in range(2))
    a64, b64 = (torch.randn(64, 64, generator=g).to(device) for _ in range(2))
    acc = torch.zeros(2, 2).to(device)
    return {
        "add_2x2": ("torch.add(a, b), 2x2 float32", lambda: torch.add(a2, b2)),
        "add_inplace_2x2": ("acc.add_(a), 2x2 float32 (no allocation)", lambda: acc.add_(a2)),
        "matmul_64x64": ("a @ b, 64x64 float32", lambda: torch.matmul(a64, b64)),
        "empty_256": ("torch.empty(256) float32, dropped (caching allocator alloc + free only)",
                      lambda: torch.empty(256, device=device)),
    }


def sync(device):
    if device.type == "vnpu":
        torch.vnpu.synchronize(device)


def measure(fn, device, iters, repeats, warmup):
    for _ in range(warmup):
        fn()
    sync(device)
    host, e2e = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        t1 = time.perf_counter()
        sync(device)
        t2 = time.perf_counter()
        host.append((t1 - t0) / iters * 1e6)
        e2e.append((t2 - t0) / iters * 1e6)
    return {"host_us": statistics.median(host), "e2e_us": statistics.median(e2e),
            "host_us_all": host, "e2e_us_all": e2e}


MODES = ("off", "profiler", "memory_history")


@contextlib.contextmanager
def instrumented(mode, device):
    """Runs the body with `mode`'s instrumentation on for `device` (see the module docstring)."""
    if mode == "profiler":
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.PrivateUse1] if device.type == "vnpu" else [])
        with profile(activities=acts):
            yield
            sync(device)
    elif mode == "memory_history" and device.type == "vnpu":
        torch.vnpu.memory._record_memory_history(max_entries=100_000)
        try:
            yield
        finally:
            sync(device)
            torch.vnpu.memory._record_memory_history(enabled=None)
    else:
        yield


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out/bench", help="output directory (default: out/bench)")
    p.add_argument("--iters", type=int, default=2000, help="calls per timed repeat")
    p.add_argument("--repeats", type=int, default=7, help="timed repeats (the median is reported)")
    p.add_argument("--warmup", type=int, default=200, help="untimed calls first")
    p.add_argument("--ops", default=None, help="comma-separated subset of op names")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--modes", default=None,
                   help=f"comma-separated instrumentation modes to compare, of {','.join(MODES)} (default: off)")
    run_meta = _meta.begin(__file__, argv)
    args = p.parse_args(argv)
    modes = args.modes.split(",") if args.modes else ["off"]
    for m in modes:
        if m not in MODES:
            p.error(f"unknown mode {m!r}; choose from {', '.join(MODES)}")
    if args.modes:
        return main_modes(args, modes, run_meta)
    if args.threads:
        torch.set_num_threads(args.threads)

    devices = [torch.device("cpu"), torch.device("vnpu", 0)]
    results = []
    for dev in devices:
        ops = make_ops(dev)
        names = args.ops.split(",") if args.ops else list(ops)
        for name in names:
            desc, fn = ops[name]
            r = measure(fn, dev, args.iters, args.repeats, args.warmup)
            results.append({"op": name, "desc": desc, "device": dev.type, **r})

    rows = []
    for name in dict.fromkeys(r["op"] for r in results):
        cpu = next(r for r in results if r["op"] == name and r["device"] == "cpu")
        vn = next(r for r in results if r["op"] == name and r["device"] == "vnpu")
        rows.append({
            "op": name, "desc": cpu["desc"],
            "cpu_us": cpu["e2e_us"],
            "vnpu_host_us": vn["host_us"], "vnpu_e2e_us": vn["e2e_us"],
            "ratio_host": vn["host_us"] / cpu["e2e_us"], "ratio_e2e": vn["e2e_us"] / cpu["e2e_us"],
        })

    meta = {
        "benchmark": "eager_overhead", "torch": torch.__version__, "python": platform.python_version(),
        "cpu_count": os.cpu_count(), "torch_num_threads": torch.get_num_threads(),
        "loadavg_at_end": os.getloadavg(), "iters": args.iters, "repeats": args.repeats, "warmup": args.warmup,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "fallback_ops": torch.vnpu.get_fallback_ops(),
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "eager_overhead.json")
    with open(path, "w") as f:
        json.dump({"run": _meta.end(run_meta), "meta": meta, "summary": rows, "raw": results}, f, indent=2)

    hdr = f"{'op':<18}{'cpu µs':>10}{'vnpu host µs':>14}{'vnpu e2e µs':>13}{'host ratio':>12}{'e2e ratio':>11}"
    print(f"eager overhead per call (median of {args.repeats} x {args.iters} calls; ratio = vnpu / cpu)")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['op']:<18}{r['cpu_us']:>10.2f}{r['vnpu_host_us']:>14.2f}{r['vnpu_e2e_us']:>13.2f}"
              f"{r['ratio_host']:>11.1f}x{r['ratio_e2e']:>10.1f}x")
    print(f"wrote {path}")
    return rows


def main_modes(args, modes, run_meta):
    """--modes: per op, each mode in turn on cpu then vnpu (interleaved, so load changes hit all modes)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = [torch.device("cpu"), torch.device("vnpu", 0)]
    ops = {dev.type: make_ops(dev) for dev in devices}
    names = args.ops.split(",") if args.ops else list(ops["cpu"])
    results = []
    for name in names:
        for mode in modes:
            for dev in devices:
                desc, fn = ops[dev.type][name]
                with instrumented(mode, dev):
                    r = measure(fn, dev, args.iters, args.repeats, args.warmup)
                results.append({"op": name, "desc": desc, "mode": mode, "device": dev.type, **r})

    def get(name, mode, device):
        return next(r for r in results if r["op"] == name and r["mode"] == mode and r["device"] == device)

    rows = []
    for name in names:
        base = get(name, modes[0], "vnpu")["host_us"]
        for mode in modes:
            cpu, vn = get(name, mode, "cpu"), get(name, mode, "vnpu")
            rows.append({"op": name, "mode": mode, "cpu_us": cpu["e2e_us"], "vnpu_host_us": vn["host_us"],
                         "vnpu_e2e_us": vn["e2e_us"], "ratio_host_vs_cpu": vn["host_us"] / cpu["e2e_us"],
                         f"vnpu_host_vs_{modes[0]}": vn["host_us"] / base})
    meta = {
        "benchmark": "eager_overhead_modes", "modes": modes, "torch": torch.__version__,
        "python": platform.python_version(), "cpu_count": os.cpu_count(), "torch_num_threads": torch.get_num_threads(),
        "loadavg_at_end": os.getloadavg(), "iters": args.iters, "repeats": args.repeats, "warmup": args.warmup,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "eager_overhead_modes.json")
    with open(path, "w") as f:
        json.dump({"run": _meta.end(run_meta), "meta": meta, "summary": rows, "raw": results}, f, indent=2)
    hdr = (f"{'op':<18}{'mode':<16}{'cpu µs':>10}{'vnpu host µs':>14}{'vnpu e2e µs':>13}{'host/cpu':>10}"
           f"{'host/' + modes[0]:>14}")
    print(f"host cost per call with instrumentation (median of {args.repeats} x {args.iters} calls; "
          f"load average {os.getloadavg()[0]:.1f})")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['op']:<18}{r['mode']:<16}{r['cpu_us']:>10.2f}{r['vnpu_host_us']:>14.2f}{r['vnpu_e2e_us']:>13.2f}"
              f"{r['ratio_host_vs_cpu']:>9.1f}x{r[f'vnpu_host_vs_{modes[0]}']:>13.2f}x")
    print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()
