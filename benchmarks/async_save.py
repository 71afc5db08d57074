"""Training while a checkpoint is written: torch.distributed.checkpoint.async_save of an FSDP2 model on vnpu.

One process (world size 1, backend ``cpu:gloo,vnpu:vccl``) trains an MLP stack sharded with FSDP2 (--layers
Linear(--width, --width) layers with GELU, AdamW) on vnpu. Measured, in one run:

  step          median training step (forward, backward, optimizer step, synchronized) without a save
  save_call     the blocking part of ``dcp.async_save`` (it stages the state to host memory at the call)
  during        median step while the checkpoint is being written (steps from the call until its future is done)
  save_total    wall time from the call until the write finished
  sync_save     ``dcp.save`` of the same state (blocking), for comparison

Ratio: during / step (target <= 1.2). The checkpoint is written to a temporary directory and read back once to
check that it holds the state as of the call (bitwise), not the state after the later steps.

Writes OUT/async_save.json and prints a table.

    python benchmarks/async_save.py --out out/bench [--layers 8 --width 1024 --saves 3]
"""

import argparse
import json
import os
import statistics
import tempfile
import time

import _meta


def _run(args, directory):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch import nn
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("cpu:gloo,vnpu:vccl", init_method=f"file://{directory}/store", rank=0, world_size=1)
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.GELU()]
    model = nn.Sequential(*layers).to("vnpu")
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.width, device="vnpu")

    def step():
        t0 = time.perf_counter()
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        torch.vnpu.synchronize()
        return time.perf_counter() - t0

    for _ in range(args.warmup):
        step()
    plain = [step() for _ in range(args.steps)]
    calls, during, totals, syncs = [], [], [], []
    nbytes = 0
    for i in range(args.saves):
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        if i == 0:
            nbytes = sum(v.to_local().numel() * v.to_local().element_size() if hasattr(v, "to_local")
                         else v.numel() * v.element_size()
                         for v in msd.values())
            expected = {k: v.to_local().cpu().clone() for k, v in msd.items()}
        t0 = time.perf_counter()
        fut = dcp.async_save(state, checkpoint_id=os.path.join(directory, f"async-{i}"))
        calls.append(time.perf_counter() - t0)
        steps = 0
        while not fut.done() or steps == 0:
            during.append(step())
            steps += 1
        fut.result()
        totals.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        dcp.save(state, checkpoint_id=os.path.join(directory, f"sync-{i}"))
        syncs.append(time.perf_counter() - t0)
    # The first async checkpoint holds the state of its call, although training went on.
    msd, _ = get_state_dict(model, opt)
    loaded = {k: torch.empty_like(v.to_local()) for k, v in msd.items()}
    dcp.load({"model": loaded}, checkpoint_id=os.path.join(directory, "async-0"), no_dist=True)
    as_of_call = all(torch.equal(loaded[k].cpu(), expected[k]) for k in expected)
    dist.destroy_process_group()
    return {"step_s": plain, "save_call_s": calls, "during_s": during, "save_total_s": totals, "sync_save_s": syncs,
            "model_bytes": nbytes, "checkpoint_as_of_call": as_of_call}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out/bench")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--saves", type=int, default=3)
    args = p.parse_args(argv)
    run_meta = _meta.begin(__file__, argv)
    with tempfile.TemporaryDirectory() as d:
        r = _run(args, d)
    med = {k: statistics.median(v) for k, v in r.items() if k.endswith("_s")}
    report = {"run": _meta.end(run_meta), "layers": args.layers, "width": args.width, "batch": args.batch,
              "model_bytes": r["model_bytes"], "checkpoint_as_of_call": r["checkpoint_as_of_call"],
              "steps_during_saves": len(r["during_s"]), "median_s": med,
              "during_over_step": med["during_s"] / med["step_s"], "raw": {k: v for k, v in r.items()
                                                                           if k.endswith("_s")}}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "async_save.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(f"FSDP2 MLP: {args.layers} x Linear({args.width}, {args.width}), AdamW; parameters "
          f"{r['model_bytes'] / (1 << 20):.0f} MiB (checkpoint with optimizer state ~3x); load average "
          f"{report['run']['load_average_before']} -> {report['run']['load_average_after']}")
    for k, label in (("step_s", "training step, no save"), ("save_call_s", "async_save call (blocking part)"),
                     ("during_s", "training step while writing"), ("save_total_s", "async_save until written"),
                     ("sync_save_s", "dcp.save (blocking)")):
        print(f"{label:<34} {med[k] * 1e3:9.1f} ms")
    print(f"step while writing / step = {report['during_over_step']:.2f} (target <= 1.2); "
          f"{report['steps_during_saves']} steps ran during {args.saves} saves; checkpoint as of the call: "
          f"{r['checkpoint_as_of_call']}")
    if not r["checkpoint_as_of_call"]:
        raise SystemExit("the async checkpoint does not hold the state of its call")


if __name__ == "__main__":
    main()
