"""Profile a few training steps of the GPT of train_gpt.py on vnpu with torch.profiler.

Exactly what one does on CUDA, with ProfilerActivity.PrivateUse1 (the vnpu activity) in place of
ProfilerActivity.CUDA: the trace shows the host's operators, one lane per vnpu stream with the kernels
(named after the ATen operator, or the generated kernel with --compile) and copies that ran on it, and an
arrow from each launch to its task.

    python examples/profile_gpt.py --out out/profile              # eager
    python examples/profile_gpt.py --out out/profile --compile    # torch.compile'd model and optimizer step

Steps: --wait 1 (not recorded), --warmup 1 (recorded, dropped), --active 3 (kept), via torch.profiler.schedule.
Writes, in --out: trace.json (chrome trace: open it in https://ui.perfetto.dev or chrome://tracing),
trace.png (a lane plot of the last recorded step, drawn from trace.json with matplotlib) and top_ops.txt
(key_averages().table() sorted by self device time); prints the device tasks with the most time.
"""

import argparse
import json
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_gpt import GPTConfig, build, get_batch, load_corpus  # noqa: E402


def plot_lanes(trace_path, png_path, title):
    """Draws the last recorded step from trace.json as lanes: the host's ranges and long operators, then one lane
    per vnpu stream, from the step's start to the end of the last device task its operators launched."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    steps = [e for e in spans if e["name"].startswith("ProfilerStep#")]
    if not steps:
        return
    step = max(steps, key=lambda e: e["ts"])
    t0, host_end = step["ts"], step["ts"] + step["dur"]
    in_step = {e["args"].get("External id") for e in spans
               if e.get("cat") == "cpu_op" and t0 <= e["ts"] <= host_end}
    device = [e for e in spans if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    t1 = max([e["ts"] + e["dur"] for e in device if e["args"].get("External id") in in_step] + [host_end])
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    colors = {"kernel": "tab:blue", "gpu_memcpy": "tab:orange", "gpu_memset": "tab:olive",
              "user_annotation": "tab:green", "cpu_op": "tab:gray"}
    groups = {}  # lane name -> bars (start, end, color, label)
    for e in spans:
        end = e["ts"] + e["dur"]
        if end < t0 or e["ts"] > t1:
            continue
        cat = e.get("cat")
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            lane = f"vnpu:{e['pid']} {names.get((e['pid'], e['tid']), 'stream ' + str(e['tid']))}"
        elif cat == "user_annotation":
            lane = "host: record_function"
        elif cat == "cpu_op" and e["dur"] >= 0.01 * (host_end - t0):
            lane = "host: operators"
        else:
            continue
        groups.setdefault(lane, []).append((max(e["ts"], t0), min(end, t1), colors[cat], e["name"]))
    # Overlapping bars of one lane (nested ranges) go to sub-rows.
    rows = []  # (label, bars)
    for lane in sorted(groups, key=lambda n: (not n.startswith("host"), n)):
        sub = []
        for bar in sorted(groups[lane]):
            for r in sub:
                if r[-1][1] <= bar[0]:
                    r.append(bar)
                    break
            else:
                sub.append([bar])
        for i, r in enumerate(sub[:4]):
            rows.append((lane if i == 0 else "", r))
    fig, ax = plt.subplots(figsize=(13, 0.45 * len(rows) + 1.6))
    scale = 1e-3  # trace µs -> ms
    for y, (_, bars) in enumerate(rows):
        for start, end, color, name in bars:
            w = (end - start) * scale
            ax.broken_barh([((start - t0) * scale, max(w, 1e-3))], (y - 0.4, 0.8), facecolors=color,
                           edgecolor="black", linewidth=0.2)
            if w > 0.05 * (t1 - t0) * scale:
                ax.text((start - t0) * scale + w / 2, y, name[:30], ha="center", va="center", fontsize=6,
                        clip_on=True)
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.invert_yaxis()
    ax.axvline((host_end - t0) * scale, color="red", linewidth=0.8, linestyle="--")
    ax.set_xlabel(f"ms since the start of {step['name']} (dashed: the host finished the step)")
    ax.set_title(title)
    ax.set_xlim(0, (t1 - t0) * scale)
    fig.tight_layout()
    fig.savefig(png_path, dpi=130)
    plt.close(fig)


def top_device_ops(prof, rows):
    """A short table of the device tasks with the most time: name, calls, total ms, mean µs, share."""
    from torch.autograd import DeviceType

    tasks = [e for e in prof.key_averages() if e.device_type != DeviceType.CPU]
    total = sum(e.self_device_time_total for e in tasks) or 1.0
    tasks.sort(key=lambda e: -e.self_device_time_total)
    width = max([len("all device tasks")] + [len(e.key) for e in tasks[:rows]])
    lines = [f"{'device task':<{width}} {'calls':>6} {'total ms':>10} {'mean us':>10} {'share':>7}"]
    for e in tasks[:rows]:
        lines.append(f"{e.key:<{width}} {e.count:>6} {e.self_device_time_total / 1e3:>10.2f} "
                     f"{e.self_device_time_total / e.count:>10.1f} {e.self_device_time_total / total:>7.1%}")
    lines.append(f"{'all device tasks':<{width}} {sum(e.count for e in tasks):>6} {total / 1e3:>10.2f}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out/profile")
    p.add_argument("--device", default="vnpu")
    p.add_argument("--compile", action="store_true", help="torch.compile the model and the optimizer step")
    p.add_argument("--wait", type=int, default=1)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--active", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--rows", type=int, default=10, help="rows of the printed table")
    args = p.parse_args(argv)

    device = torch.device(args.device)
    activities = [ProfilerActivity.CPU]
    if device.type == "vnpu":
        activities.append(ProfilerActivity.PrivateUse1)
    elif device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    os.makedirs(args.out, exist_ok=True)
    train_ids, _, vocab = load_corpus()
    model, opt = build(args, len(vocab), device)
    run_model, opt_step = (torch.compile(model), torch.compile(opt.step)) if args.compile else (model, opt.step)
    gen = torch.Generator().manual_seed(args.seed)

    def train_step():
        x, y = get_batch(train_ids, args.batch_size, GPTConfig.block_size, gen)
        with record_function("data"):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with record_function("forward"):
            _, loss = run_model(x, y)
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            opt_step()
            opt.zero_grad(set_to_none=True)
        return loss

    if args.compile:  # compile outside the profiled steps
        train_step()
    trace_path = os.path.join(args.out, "trace.json")
    steps = args.wait + args.warmup + args.active
    with profile(activities=activities, schedule=schedule(wait=args.wait, warmup=args.warmup, active=args.active),
                 on_trace_ready=lambda prof: prof.export_chrome_trace(trace_path)) as prof:
        for step in range(steps):
            loss = train_step()
            print(f"step {step}: loss {loss.item():.4f}")  # waits for the step's device work, as logging does
            prof.step()

    table = prof.key_averages().table(sort_by="self_device_time_total" if len(activities) > 1
                                      else "self_cpu_time_total", row_limit=args.rows)
    with open(os.path.join(args.out, "top_ops.txt"), "w") as f:
        f.write(table + "\n")
    if len(activities) > 1:
        print(top_device_ops(prof, args.rows))
    else:
        print(table)
    png = os.path.join(args.out, "trace.png")
    plot_lanes(trace_path, png, f"GPT training step on {device}{' (compiled)' if args.compile else ''}")
    print(f"wrote {trace_path} (open in https://ui.perfetto.dev), {png}, {os.path.join(args.out, 'top_ops.txt')}")


if __name__ == "__main__":
    main()
