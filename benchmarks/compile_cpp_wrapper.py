"""torch.compile's C++ wrapper (``cpp_wrapper=True``) against the Python wrapper, on vnpu and on CPU.

The work: a small MLP training step (4 blocks of Linear(256) + LayerNorm + GELU, a head of 10 classes; batch
--batch; forward, cross entropy, backward; gradients set to None), compiled with torch.compile. Small
layers make the wrapper's per-kernel host cost visible, which is what the C++ wrapper removes.

Configurations, each in a process of its own with an empty Inductor cache (a fresh TORCHINDUCTOR_CACHE_DIR):
  compiled cpu / compiled vnpu, each with the Python wrapper and with the C++ wrapper.
Compile time: time to the end of the first step (forward and backward graphs compiled, cold cache).
Step time: --warmup untimed steps, then --repeats timings of --steps synced steps; the median and the minimum
per step (on a shared machine the minimum is the less disturbed one).

Writes OUT/compile_cpp_wrapper.json and prints a table, with the load average before and after.

    python benchmarks/compile_cpp_wrapper.py --out out/bench [--steps 50 --repeats 5]
"""

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import tempfile
import time

import _meta

CONFIGS = [("cpu", False), ("cpu", True), ("vnpu", False), ("vnpu", True)]


def label(device, cpp_wrapper):
    return f"compiled {device}, {'C++' if cpp_wrapper else 'Python'} wrapper"


def config_process(device, cpp_wrapper, args, cache_dir, conn):
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch._inductor.config.cpp_wrapper = cpp_wrapper
    torch.manual_seed(0)
    width = 256
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.LayerNorm(width), nn.GELU())
                            for _ in range(4)], nn.Linear(width, 10)).to(device)
    compiled = torch.compile(model)
    x = torch.randn(args.batch, width, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)

    def sync():
        if device == "vnpu":
            torch.vnpu.synchronize()

    def step():
        loss = F.cross_entropy(compiled(x), y)
        loss.backward()
        for p in model.parameters():
            p.grad = None
        return loss

    t0 = time.perf_counter()
    step()
    sync()
    compile_s = time.perf_counter() - t0
    for _ in range(args.warmup):
        step()
    sync()
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        sync()
        times.append((time.perf_counter() - t0) / args.steps)
    conn.send({"compile_s": compile_s, "step_ms": 1e3 * statistics.median(times), "step_ms_min": 1e3 * min(times),
               "step_ms_all": [1e3 * t for t in times], "loss": float(step().detach().cpu())})
    conn.close()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=50, help="steps per timing")
    p.add_argument("--repeats", type=int, default=5, help="timings per configuration")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps after the first")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--out", default="out/bench", help="output directory (default: out/bench)")
    run_meta = _meta.begin(__file__, argv)
    args = p.parse_args(argv)

    ctx = multiprocessing.get_context("spawn")
    load_before = os.getloadavg()
    results = {}
    for device, cpp_wrapper in CONFIGS:
        cache_dir = tempfile.mkdtemp(prefix="vnpu_cppw_cache_")
        try:
            parent, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=config_process, args=(device, cpp_wrapper, args, cache_dir, child))
            proc.start()
            child.close()
            if not parent.poll(1800):
                proc.kill()
                raise TimeoutError(f"{label(device, cpp_wrapper)}: no result in 30 min")
            results[label(device, cpp_wrapper)] = parent.recv()
            proc.join(60)
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
    load_after = os.getloadavg()

    report = {"run": _meta.end(run_meta),
              "configs": results, "load_average_before": load_before, "load_average_after": load_after,
              "args": vars(args), "machine": platform.platform(), "cpus": os.cpu_count(),
              "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "compile_cpp_wrapper.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=2)

    print(f"load average {load_before[0]:.2f} -> {load_after[0]:.2f}; {os.cpu_count()} CPUs")
    print(f"{'configuration':34s} {'cold compile s':>14s} {'step ms (median)':>16s} {'(min)':>8s} {'loss':>10s}")
    for name, r in results.items():
        print(f"{name:34s} {r['compile_s']:14.1f} {r['step_ms']:16.3f} {r['step_ms_min']:8.3f} {r['loss']:10.6f}")
    for device in ("cpu", "vnpu"):
        py, cpp = results[label(device, False)], results[label(device, True)]
        print(f"{device}: C++ / Python wrapper step time {cpp['step_ms'] / py['step_ms']:.3f} "
              f"(minimum {cpp['step_ms_min'] / py['step_ms_min']:.3f}), "
              f"cold compile {cpp['compile_s'] / py['compile_s']:.2f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
