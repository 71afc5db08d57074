"""Distributed GPT training-step time: vnpu with vccl vs CPU with gloo, same script, in one run.

For each --parallel mode, examples/train_gpt_dist.py runs under torchrun (--nproc-per-node N) once with
--device cpu (gloo) and once with --device vnpu (vccl), alternating for --rounds rounds; each run trains
--steps steps with --sync-steps (every step waits for its end), and the first --warmup steps are
dropped. Reported: the median step time per device over all rounds and their ratio (vnpu / cpu; < 1 means
vnpu is faster), plus the median of per-round ratios. The machine's load average is recorded.

Writes OUT/dist_train_step.json and prints a table.

    python benchmarks/dist_train_step.py --out out/bench [--modes ddp fsdp --nproc 2 --steps 12 --rounds 3]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import _meta

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "examples", "train_gpt_dist.py")


def run(mode, device, nproc, steps, port):
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port",
               str(port), SCRIPT, "--parallel", mode, "--device", device, "--steps", str(steps), "--sync-steps",
               "--quiet", "--out", out]
        env = dict(os.environ, VNPU_DEVICE_COUNT=str(max(2, nproc)))
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
        with open(os.path.join(out, "losses.json")) as f:
            return json.load(f)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", nargs="+", default=["ddp", "fsdp"], choices=["ddp", "fsdp", "tp", "fsdp+tp"])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="out/bench")
    run_meta = _meta.begin(__file__, argv)
    args = p.parse_args(argv)
    from torch_vnpu.testing.distributed import free_port

    load_start = os.getloadavg()
    rows = []
    for mode in args.modes:
        per = {"cpu": [], "vnpu": []}
        round_ratios = []
        for _ in range(args.rounds):
            medians = {}
            for device in ("cpu", "vnpu"):
                r = run(mode, device, args.nproc, args.steps, free_port())
                steps = r["step_seconds"][args.warmup:]
                per[device].extend(steps)
                medians[device] = statistics.median(steps)
            round_ratios.append(medians["vnpu"] / medians["cpu"])
        cpu, vnpu = statistics.median(per["cpu"]), statistics.median(per["vnpu"])
        rows.append({"mode": mode, "nproc": args.nproc, "cpu_ms": cpu * 1e3, "vnpu_ms": vnpu * 1e3,
                     "ratio": vnpu / cpu, "round_ratio_median": statistics.median(round_ratios),
                     "round_ratios": round_ratios, "cpu_steps_s": per["cpu"], "vnpu_steps_s": per["vnpu"]})
    report = {"run": _meta.end(run_meta), "load_average_start": load_start,
              "load_average_end": os.getloadavg(), "cpus": os.cpu_count(),
              "args": vars(args), "results": rows}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "dist_train_step.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print(f"load average {load_start} -> {report['load_average_end']}; {os.cpu_count()} CPUs")
    print(f"{'mode':<9}{'ranks':>6}{'cpu+gloo ms':>13}{'vnpu+vccl ms':>14}{'ratio':>8}{'per-round':>11}")
    for r in rows:
        print(f"{r['mode']:<9}{r['nproc']:>6}{r['cpu_ms']:>13.1f}{r['vnpu_ms']:>14.1f}{r['ratio']:>8.2f}"
              f"{r['round_ratio_median']:>11.2f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
