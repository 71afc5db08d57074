"""GPT training-step time and peak memory: vnpu vs cpu, in one run.

The model, data and optimizer are those of examples/train_gpt.py (default model: 4 layers, 4 heads,
width 128; batch 16, context 128; AdamW). One step = get_batch, copy to the device, forward, backward,
optimizer step, zero_grad(set_to_none=True).

Each device trains in a process of its own, as a user's job would (in one process, CPU kernels on the
main thread and vnpu kernels on the stream worker keep two OpenMP pools that slow each other down; see
Note [One OpenMP pool] in csrc/ops/HostOpenMP.h).
Time: --warmup untimed steps per device, then --rounds rounds; each round times --steps steps on cpu and
then on vnpu (alternating, so drift in the machine's speed hits both devices alike). A "synced" step is
followed by a synchronize, so its time includes all of its device work; the median over all rounds is
reported (mean/min too). "pipelined" is a round's steps issued back to back with one synchronize at the
end, divided by the step count (median over rounds): on vnpu the host enqueues step k+1 while the device
still runs step k. Besides the ratio of the medians, the table gives the median of per-round ratios (each
round's vnpu median over its cpu median; the steps of a round ran back to back, so slow drift cancels).

Peak memory (bytes of tensor storage, measured over one step after the timed ones):
  vnpu  torch.vnpu.max_memory_allocated() after reset_peak_memory_stats(): the caching allocator's peak
        of allocated bytes (block sizes, rounded up to 512 bytes), parameters and optimizer state included.
  cpu   persistent bytes (the unique storages of parameters and optimizer state, alive before the step)
        plus the peak of "Total Allocated" that torch.profiler(profile_memory=True) reports for the CPU
        allocator during the step (everything allocated in the step and not yet freed).
The two count the same thing, tensor storage, with two differences, both reported rather than hidden:
vnpu rounds each block up to 512 bytes, and the CPU allocator also serves the scratch buffers that CPU
kernels allocate internally (on vnpu those live in host memory of the worker thread, not device memory).
The step's share above the persistent bytes is reported separately for both devices.

--sanitize runs the vnpu process under VNPU_SANITIZE (torch.vnpu.sanitizer.enable(), docs/sanitizer.md) and
writes OUT/train_step_sanitize.json: compare its vnpu/cpu ratio with a run without it for the sanitizer's cost.

Writes OUT/train_step.json and prints a table.

    python benchmarks/train_step.py --out out/bench [--rounds 6 --steps 5 --warmup 3] [--sanitize]
"""

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time

import torch
from tqdm import tqdm

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import train_gpt  # noqa: E402  (examples/train_gpt.py)

import _meta  # noqa: E402


def sync(device):
    if device.type == "vnpu":
        torch.vnpu.synchronize(device)


class Trainer:
    def __init__(self, device, train_ids, vocab_size, args):
        self.device = device
        self.train_ids = train_ids
        self.args = args
        self.model, self.opt = train_gpt.build(argparse.Namespace(seed=args.seed, lr=args.lr), vocab_size, device)
        self.gen = torch.Generator().manual_seed(args.seed)

    def step(self):
        x, y = train_gpt.get_batch(self.train_ids, self.args.batch_size, self.model.cfg.block_size, self.gen)
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        _, loss = self.model(x, y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()

    def persistent_bytes(self):
        """Bytes of the unique storages of parameters and optimizer state (tied weights counted once)."""
        seen = {}
        tensors = list(self.model.parameters()) + list(self.model.buffers())
        for state in self.opt.state.values():
            tensors += [t for t in state.values() if isinstance(t, torch.Tensor)]
        for t in tensors:
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
        return sum(seen.values())


def warm_up(tr, args):
    for _ in range(args.warmup):
        tr.step()
    sync(tr.device)
    tr.times, tr.losses, tr.pipelined = [], [], []


def time_round(tr, args):
    """One round on one device: --steps synced steps, then --steps pipelined steps."""
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = tr.step()
        sync(tr.device)
        tr.times.append(time.perf_counter() - t0)
        tr.losses.append(loss.item())
    t0 = time.perf_counter()
    for _ in range(args.steps):
        tr.step()
    sync(tr.device)
    tr.pipelined.append((time.perf_counter() - t0) / args.steps)


def timing(tr):
    return {"median_s": statistics.median(tr.times), "mean_s": statistics.mean(tr.times), "min_s": min(tr.times),
            "pipelined_s": statistics.median(tr.pipelined), "pipelined_rounds_s": tr.pipelined,
            "step_times_s": tr.times, "losses": tr.losses}


def vnpu_peak(tr):
    dev = tr.device
    torch.vnpu.synchronize(dev)
    torch.vnpu.reset_peak_memory_stats(dev)
    before = torch.vnpu.memory_allocated(dev)
    tr.step()
    torch.vnpu.synchronize(dev)
    peak = torch.vnpu.max_memory_allocated(dev)
    return {"peak_bytes": peak, "persistent_bytes": before, "step_bytes": peak - before,
            "persistent_storage_bytes": tr.persistent_bytes(),
            "reserved_peak_bytes": torch.vnpu.max_memory_reserved(dev)}


def cpu_peak(tr):
    from torch.profiler import ProfilerActivity, profile

    persistent = tr.persistent_bytes()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        tr.step()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.unlink(path)
    cpu_type = 0  # c10::DeviceType::CPU
    totals = [e["args"]["Total Allocated"] for e in events
              if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == cpu_type]
    step = max([0] + totals)
    return {"peak_bytes": persistent + step, "persistent_bytes": persistent, "step_bytes": step,
            "memory_events": len(totals)}


def device_process(device, args, conn):
    """Trains on one device in its own process; times a round per "round" message from the parent."""
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.sanitize and device.startswith("vnpu"):
        torch.vnpu.sanitizer.enable()
    train_ids, _, vocab = train_gpt.load_corpus()
    tr = Trainer(torch.device(device), train_ids, len(vocab), args)
    warm_up(tr, args)
    conn.send("ready")
    while conn.recv() == "round":
        time_round(tr, args)
        conn.send("done")
    r = timing(tr)
    r["memory"] = vnpu_peak(tr) if tr.device.type == "vnpu" else cpu_peak(tr)
    r["parameters"] = sum(p.numel() for p in tr.model.parameters())
    r["device"] = tr.device.type
    r["torch_num_threads"] = torch.get_num_threads()
    r["fallback_ops"] = torch.vnpu.get_fallback_ops() if tr.device.type == "vnpu" else {}
    conn.send(r)


def mib(n):
    return n / 2**20


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=5, help="timed steps per device and round")
    p.add_argument("--rounds", type=int, default=6, help="rounds of alternating cpu/vnpu timing")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--out", default="out/bench", help="output directory (default: out/bench)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--sanitize", action="store_true", help="vnpu under VNPU_SANITIZE (docs/sanitizer.md)")
    run_meta = _meta.begin(__file__, argv)
    args = p.parse_args(argv)

    ctx = multiprocessing.get_context("spawn")
    procs, conns = [], []
    for dev in ("cpu", "vnpu:0"):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=device_process, args=(dev, args, child), daemon=True)
        proc.start()
        procs.append(proc)
        conns.append(parent)
    for c in conns:
        c.recv()  # warmed up
    for _ in tqdm(range(args.rounds), desc="rounds (cpu, vnpu)"):
        for c in conns:  # one device at a time: the other process waits idle
            c.send("round")
            c.recv()
    results, fallback_ops = {}, {}
    for c, proc in zip(conns, procs):
        c.send("finish")
        r = c.recv()
        proc.join()
        fallback_ops.update(r.pop("fallback_ops"))
        results[r["device"]] = r
        print(f"[{r['device']}] median step {r['median_s'] * 1e3:.1f} ms, "
              f"peak {mib(r['memory']['peak_bytes']):.2f} MiB", flush=True)

    cpu, vn = results["cpu"], results["vnpu"]
    # Paired per-round ratios: both devices' steps of one round ran back to back, so drift in the
    # machine's speed between rounds cancels out of each round's ratio.
    k = args.steps
    round_ratios = [statistics.median(vn["step_times_s"][i * k:(i + 1) * k]) /
                    statistics.median(cpu["step_times_s"][i * k:(i + 1) * k]) for i in range(args.rounds)]
    pipelined_round_ratios = [v / c for c, v in zip(cpu["pipelined_rounds_s"], vn["pipelined_rounds_s"])]
    diffs = [abs(a - b) for a, b in zip(cpu["losses"], vn["losses"])]
    summary = {
        "cpu_step_ms": cpu["median_s"] * 1e3, "vnpu_step_ms": vn["median_s"] * 1e3,
        "step_time_ratio": vn["median_s"] / cpu["median_s"],
        "cpu_pipelined_ms": cpu["pipelined_s"] * 1e3, "vnpu_pipelined_ms": vn["pipelined_s"] * 1e3,
        "pipelined_ratio": vn["pipelined_s"] / cpu["pipelined_s"],
        "step_time_ratio_paired": statistics.median(round_ratios), "step_time_round_ratios": round_ratios,
        "pipelined_ratio_paired": statistics.median(pipelined_round_ratios),
        "pipelined_round_ratios": pipelined_round_ratios,
        "cpu_peak_bytes": cpu["memory"]["peak_bytes"], "vnpu_peak_bytes": vn["memory"]["peak_bytes"],
        "peak_memory_ratio": vn["memory"]["peak_bytes"] / cpu["memory"]["peak_bytes"],
        "cpu_step_bytes": cpu["memory"]["step_bytes"], "vnpu_step_bytes": vn["memory"]["step_bytes"],
        "step_memory_ratio": vn["memory"]["step_bytes"] / max(1, cpu["memory"]["step_bytes"]),
        "losses_bitwise_equal": cpu["losses"] == vn["losses"], "max_abs_loss_diff": max(diffs),
    }
    meta = {
        "benchmark": "train_step", "torch": torch.__version__, "python": platform.python_version(),
        "cpu_count": os.cpu_count(), "torch_num_threads": cpu["torch_num_threads"],
        "loadavg_at_end": os.getloadavg(), "steps": args.steps, "rounds": args.rounds, "warmup": args.warmup,
        "batch_size": args.batch_size, "block_size": 128, "parameters": cpu["parameters"],
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "fallback_ops": fallback_ops, "sanitize": args.sanitize,
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "train_step_sanitize.json" if args.sanitize else "train_step.json")
    with open(path, "w") as f:
        json.dump({"run": _meta.end(run_meta), "meta": meta, "summary": summary, "cpu": cpu, "vnpu": vn}, f, indent=2)

    print(f"\nGPT train step ({meta['parameters']:,} params, batch {args.batch_size} x 128, AdamW); "
          f"{args.rounds} rounds x {args.steps} timed steps per device after {args.warmup} warm-up")
    hdr = f"{'metric':<34}{'cpu':>12}{'vnpu':>12}{'vnpu/cpu':>10}"
    print(hdr)
    print("-" * len(hdr))
    rows = [
        ("step time, median (ms)", summary["cpu_step_ms"], summary["vnpu_step_ms"], summary["step_time_ratio"]),
        ("step time, pipelined (ms)", summary["cpu_pipelined_ms"], summary["vnpu_pipelined_ms"],
         summary["pipelined_ratio"]),
        ("peak tensor memory (MiB)", mib(summary["cpu_peak_bytes"]), mib(summary["vnpu_peak_bytes"]),
         summary["peak_memory_ratio"]),
        ("  of which params+optim (MiB)", mib(cpu["memory"]["persistent_bytes"]),
         mib(vn["memory"]["persistent_bytes"]),
         vn["memory"]["persistent_bytes"] / cpu["memory"]["persistent_bytes"]),
        ("  of which the step (MiB)", mib(summary["cpu_step_bytes"]), mib(summary["vnpu_step_bytes"]),
         summary["step_memory_ratio"]),
    ]
    for name, c, v, r in rows:
        print(f"{name:<34}{c:>12.2f}{v:>12.2f}{r:>9.2f}x")
    for name, key, rr in (("step time", "step_time_ratio_paired", round_ratios),
                          ("pipelined", "pipelined_ratio_paired", pipelined_round_ratios)):
        print(f"{name}, median of per-round ratios: {summary[key]:.2f}x "
              f"(rounds: {min(rr):.2f}x .. {max(rr):.2f}x)")
    print(f"losses over the timed steps: {'bitwise equal' if summary['losses_bitwise_equal'] else 'differ'} "
          f"(max |diff| {summary['max_abs_loss_diff']:.3g})")
    print(f"wrote {path}")
    return summary


if __name__ == "__main__":
    main()
