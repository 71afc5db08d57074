"""Makes the two pictures of docs/profiling.md from a run of examples/profile_gpt.py on vnpu, offline.

    .venv/bin/python scripts/profiling_screenshots.py [--out out/screenshots] [--img docs/img]

It runs examples/profile_gpt.py (5 steps of the GPT, the last 3 profiled) with the caching allocator's memory
history on, keeps its trace.json and dumps snapshot.pickle, then draws with matplotlib:

  docs/img/profile_trace.png   the trace as a timeline viewer shows it: the "forward" record_function range of
                               the last profiled step up to the end of the first 16 device tasks it launched; the
                               host thread's operators and ranges (nested: one row per depth) and one lane per
                               vnpu stream, with an arrow from each launch on the host thread to its task on the
                               stream (the "ac2g" flows of trace.json)
  docs/img/memory_timeline.png the memory history as `python -m torch.cuda._memory_viz trace_plot` shows it
                               ("Active Memory Timeline"): every allocation of vnpu:0 as a band, stacked in the
                               order they were made, over the snapshot's alloc/free events

Why drawn and not screenshots of the viewers: Perfetto's UI is a web app, chrome://tracing does not load in
headless Chromium, and the page `_memory_viz trace_plot` writes imports PyTorch's MemoryViz.js and d3 from a
CDN (the torch wheel ships neither), and nothing may be fetched here. Both pictures are made from the very
files the viewers open (trace.json, snapshot.pickle): open those in https://ui.perfetto.dev and
https://pytorch.org/memory_viz for the interactive views.
"""

import argparse
import json
import os
import pickle
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
COLORS = {"kernel": "#4e79a7", "gpu_memcpy": "#f28e2c", "gpu_memset": "#bab0ab", "user_annotation": "#59a14f",
          "cpu_op": "#9c9c9c", "vnpu_runtime": "#e15759"}


def run_profile(out):
    """Runs examples/profile_gpt.py into `out` with memory history on; returns (trace.json, snapshot.pickle)."""
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import profile_gpt

    torch.vnpu.memory._record_memory_history(max_entries=200_000, stacks="python")
    profile_gpt.main(["--out", out])
    snapshot = os.path.join(out, "snapshot.pickle")
    torch.vnpu.memory._dump_snapshot(snapshot)
    torch.vnpu.memory._record_memory_history(enabled=None)
    return os.path.join(out, "trace.json"), snapshot


def _rows(bars):
    """Nested or overlapping bars of one lane go to sub-rows (first fit); returns a list of rows."""
    rows = []
    for bar in sorted(bars, key=lambda b: (b[0], -b[1])):
        for r in rows:
            if r[-1][1] <= bar[0] + 1e-6:
                r.append(bar)
                break
        else:
            rows.append([bar])
    return rows


def draw_trace(trace_path, png, max_host_rows=5, max_tasks=16):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    step = max((e for e in spans if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
    fwd = [e for e in spans if e.get("cat") == "user_annotation" and e["name"] == "forward"
           and step["ts"] <= e["ts"] <= step["ts"] + step["dur"]]
    win = fwd[0] if fwd else step
    t0, t_host = win["ts"], win["ts"] + win["dur"]
    ids = {e["args"].get("External id") for e in spans if e.get("cat") == "cpu_op" and t0 <= e["ts"] <= t_host}
    device = [e for e in spans if e.get("cat") in DEVICE_CATS and e["args"].get("External id") in ids]
    # Up to the end of the first `max_tasks` device tasks the range launched, so the arrows stay readable.
    device.sort(key=lambda e: e["ts"])
    t1 = max([e["ts"] + e["dur"] for e in device[:max_tasks]] + [t_host])
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    pnames = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}

    lanes = {}  # (sort key, label) -> bars
    for e in spans:
        s, end = e["ts"], e["ts"] + e["dur"]
        cat = e.get("cat")
        if cat in DEVICE_CATS:
            if e["args"].get("External id") not in ids or e["ts"] > t1:
                continue
            key = (1, e["pid"], e["tid"])
            label = f"{pnames.get(e['pid'], e['pid'])} {names.get((e['pid'], e['tid']), e['tid'])}"
        elif cat in ("cpu_op", "user_annotation", "vnpu_runtime") and t0 <= s and end <= t_host + 1:
            key = (0, e["pid"], e["tid"])
            label = f"host thread {e['tid']}"
        else:
            continue
        lanes.setdefault((key, label), []).append((s, end, cat, e["name"]))
    rows, ypos = [], {}  # (label, bars); (ts, lane key) of a bar -> its y
    for (key, label), bars in sorted(lanes.items()):
        sub = _rows(bars)
        if key[0] == 0:
            sub = sub[:max_host_rows]
        for i, r in enumerate(sub):
            for b in r:
                ypos[(key[0], b[0])] = len(rows)
            rows.append((label if i == 0 else "", r))

    fig, ax = plt.subplots(figsize=(12, 0.42 * len(rows) + 1.7))
    ms = 1e-3
    for y, (_, bars) in enumerate(rows):
        for s, end, cat, name in bars:
            w = max((end - s) * ms, 1e-4)
            ax.broken_barh([((s - t0) * ms, w)], (y - 0.38, 0.76), facecolors=COLORS.get(cat, "#777"),
                           edgecolor="black", linewidth=0.2)
            if w > 0.045 * (t1 - t0) * ms:
                ax.text((s - t0) * ms + w / 2, y, name[:28], ha="center", va="center", fontsize=6, clip_on=True)
    # Flow arrows: launch ("s" on the host thread) -> task ("f" on the stream lane).
    starts = {e["id"]: e for e in events if e.get("ph") == "s" and e.get("cat") == "ac2g"}
    for f in (e for e in events if e.get("ph") == "f" and e.get("cat") == "ac2g"):
        s = starts.get(f["id"])
        if s is None or not t0 <= s["ts"] <= t_host or f["ts"] > t1:
            continue
        y0, y1 = ypos.get((0, _enclosing_start(lanes, s))), ypos.get((1, f["ts"]))
        if y0 is None or y1 is None:
            continue
        ax.annotate("", xy=((f["ts"] - t0) * ms, y1 - 0.38), xytext=((s["ts"] - t0) * ms, y0 + 0.38),
                    arrowprops=dict(arrowstyle="->", color="#d62728", lw=0.35, alpha=0.55))
    ax.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, (t1 - t0) * ms)
    ax.set_xlabel(f"ms since the start of the '{win['name']}' range of {step['name']} (trace.json, pid/tid lanes "
                  "as Perfetto shows them)", fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[c]) for c in ("cpu_op", "user_annotation", "kernel",
                                                                       "gpu_memcpy")]
    handles.append(plt.Line2D([0], [0], color="#d62728", lw=0.8))
    ax.legend(handles, ["operator (cpu_op)", "record_function", "kernel", "memcpy", "launch -> task (ac2g flow)"],
              fontsize=7, loc="upper right", ncol=5)
    ax.set_title("torch.profiler trace of a GPT training step on vnpu: host thread and vnpu stream lanes", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


def _enclosing_start(lanes, flow_start):
    """ts of the host bar a flow starts in: the innermost host span of the flow's thread containing its ts."""
    best = None
    for (key, _), bars in lanes.items():
        if key[0] != 0 or key[2] != flow_start["tid"]:
            continue
        for s, end, _, _ in bars:
            if s <= flow_start["ts"] <= end and (best is None or s >= best[0]):
                best = (s, end)
    return best[0] if best else None


def draw_memory(snapshot_path, png, device=0):
    """The Active Memory Timeline of _memory_viz trace_plot: live allocations stacked, over alloc/free events."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection

    with open(snapshot_path, "rb") as f:
        snap = pickle.load(f)
    trace = [e for e in snap["device_traces"][device] if e["action"] in ("alloc", "free_completed")]
    live = []  # [addr, size, start index, [(x, lower y)]]
    polys, colors = [], []
    palette = ["#4e79a7", "#f28e2c", "#e15759", "#76b7b2", "#59a14f", "#edc949", "#af7aa1", "#ff9da7", "#9c755f"]
    peak, totals = 0, []

    def close(block, x):
        pts = block[3] + [(x, block[3][-1][1])]
        lower = [(px, py) for px, py in pts]
        upper = [(px, py + block[1]) for px, py in reversed(pts)]
        polys.append([(px, py / 2**20) for px, py in lower + upper])
        colors.append(palette[hash((block[0], block[2])) % len(palette)])

    for x, e in enumerate(trace):
        if e["action"] == "alloc":
            base = sum(b[1] for b in live)
            live.append([e["addr"], e["size"], x, [(x, base)]])
        else:
            i = next((i for i, b in enumerate(live) if b[0] == e["addr"]), None)
            if i is None:
                continue  # allocated before the history started
            close(live.pop(i), x)
            base = sum(b[1] for b in live[:i])
            for b in live[i:]:  # the blocks above fall down
                b[3].append((x, b[3][-1][1]))
                b[3].append((x, base))
                base += b[1]
        total = sum(b[1] for b in live)
        totals.append(total)
        peak = max(peak, total)
    for b in live:
        close(b, len(trace))

    fig, ax = plt.subplots(figsize=(12, 4.6))
    ax.add_collection(PolyCollection(polys, facecolors=colors, edgecolors="none"))
    ax.set_xlim(0, len(trace))
    ax.set_ylim(0, peak / 2**20 * 1.05)
    ax.set_xlabel(f"allocation events on vnpu:{device} (alloc / free_completed, in order; {len(trace)} events)")
    ax.set_ylabel("allocated (MiB)")
    ax.set_title("Memory history of the GPT run (build, then 5 training steps) on vnpu: each band is one allocation, "
                 "stacked as _memory_viz trace_plot draws them", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(ROOT, "out", "screenshots"), help="trace.json, snapshot.pickle")
    p.add_argument("--img", default=os.path.join(ROOT, "docs", "img"), help="where the PNGs go")
    p.add_argument("--reuse", action="store_true", help="draw from an earlier run's files in --out")
    args = p.parse_args(argv)
    os.makedirs(args.img, exist_ok=True)
    if args.reuse:
        trace, snapshot = os.path.join(args.out, "trace.json"), os.path.join(args.out, "snapshot.pickle")
    else:
        trace, snapshot = run_profile(args.out)
    pngs = [os.path.join(args.img, "profile_trace.png"), os.path.join(args.img, "memory_timeline.png")]
    draw_trace(trace, pngs[0])
    draw_memory(snapshot, pngs[1])
    for png in pngs:
        print(f"wrote {png} ({os.path.getsize(png) // 1024} KB)")


if __name__ == "__main__":
    main()
