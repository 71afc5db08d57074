"""docs/benchmarks.md from the JSON the benchmark scripts (benchmarks/*.py) write: no figure typed by hand.

One section per benchmark, in BENCHMARKS' order: a table of its figures (the vnpu / cpu ratios first), then the
run's machine, date, command and load average from the JSON's "run" record (benchmarks/_meta.py). A benchmark
whose JSON is not in the directory gets a line with the command that produces it. Standard library only, so
`make bench-page` works without torch.

    python scripts/bench_page.py --in out/bench --out docs/benchmarks.md
"""

import argparse
import glob
import json
import os
import sys
from typing import Callable, NamedTuple

MIB = 2**20


class Bench(NamedTuple):
    name: str  # the JSON's file name without .json
    title: str
    what: str  # one paragraph: the work measured and how the ratio reads
    command: str  # the command that writes it (with --out <dir> appended)
    make: str  # the Makefile target that runs it, or "" when none does
    render: Callable[[dict], list]  # the JSON -> Markdown lines (tables and notes)


def ratio(x):
    return "–" if x is None else f"{x:.2f}"


def num(x, digits=1):
    return "–" if x is None else f"{x:.{digits}f}"


def plural(n, word):
    return f"{n} {word}" + ("" if n == 1 else "s")


def _is_figure(v):
    try:
        float(str(v).replace(",", ""))
        return True
    except ValueError:
        return str(v) in ("", "–")


def table(headers, rows):
    """A Markdown table; columns of figures right-aligned, the others left-aligned."""
    def cell(v):
        return str(v).replace("|", "\\|")

    align = ["---:" if rows and all(_is_figure(r[i]) for r in rows) else ":---" for i in range(len(headers))]
    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines + [""]


# --- one renderer per JSON format (each benchmark writes its own) ---

def eager_overhead(d):
    rows = [(f"`{r['op']}`", r["desc"], ratio(r["ratio_host"]), ratio(r["ratio_e2e"]), num(r["cpu_us"], 2),
             num(r["vnpu_host_us"], 2), num(r["vnpu_e2e_us"], 2)) for r in d["summary"]]
    m = d["meta"]
    return table(["op", "call", "host vnpu/cpu", "e2e vnpu/cpu", "cpu µs", "vnpu host µs", "vnpu e2e µs"], rows) + [
        f"Median of {m['repeats']} × {m['iters']} calls after {m['warmup']} warm-up calls, "
        f"{m['torch_num_threads']} torch threads. *host*: the loop alone (vnpu queues kernels asynchronously); "
        "*e2e*: the loop and a final synchronize. On cpu host = e2e.", ""]


def eager_overhead_modes(d):
    modes = d["meta"]["modes"]
    base = f"vnpu_host_vs_{modes[0]}"
    rows = [(f"`{r['op']}`", r["mode"], ratio(r["ratio_host_vs_cpu"]), ratio(r[base]), num(r["cpu_us"], 2),
             num(r["vnpu_host_us"], 2), num(r["vnpu_e2e_us"], 2)) for r in d["summary"]]
    return table(["op", "mode", "host vnpu/cpu", f"host vs {modes[0]}", "cpu µs", "vnpu host µs", "vnpu e2e µs"],
                 rows)


def train_step(d):
    s, m = d["summary"], d["meta"]
    rows = [
        ("step time, median of synced steps (ms)", ratio(s["step_time_ratio"]), num(s["cpu_step_ms"]),
         num(s["vnpu_step_ms"])),
        ("step time, median of per-round ratios", ratio(s["step_time_ratio_paired"]), "", ""),
        ("step time, pipelined (ms)", ratio(s["pipelined_ratio"]), num(s["cpu_pipelined_ms"]),
         num(s["vnpu_pipelined_ms"])),
        ("pipelined, median of per-round ratios", ratio(s["pipelined_ratio_paired"]), "", ""),
        ("peak tensor memory (MiB)", ratio(s["peak_memory_ratio"]), num(s["cpu_peak_bytes"] / MIB, 2),
         num(s["vnpu_peak_bytes"] / MIB, 2)),
        ("of which the step (MiB)", ratio(s["step_memory_ratio"]), num(s["cpu_step_bytes"] / MIB, 2),
         num(s["vnpu_step_bytes"] / MIB, 2)),
    ]
    losses = ("bitwise equal" if s["losses_bitwise_equal"]
              else f"differ (max absolute difference {s['max_abs_loss_diff']:.3g})")
    return table(["figure", "vnpu/cpu", "cpu", "vnpu"], rows) + [
        f"GPT of examples/train_gpt.py ({m['parameters']:,} parameters), batch {m['batch_size']} × "
        f"{m['block_size']}, AdamW; {plural(m['rounds'], 'round')} × {plural(m['steps'], 'timed step')} per "
        f"device after {plural(m['warmup'], 'warm-up step')}"
        f"{', vnpu under the sanitizer' if m.get('sanitize') else ''}. "
        f"Losses of the timed steps on cpu and vnpu: {losses}.", ""]


def compile_(d):
    s, m = d["summary"], d["meta"]
    ratios = [
        ("compiled vnpu / compiled cpu", ratio(s["compiled_vnpu_over_compiled_cpu"]),
         ratio(s["compiled_vnpu_over_compiled_cpu_paired"])),
        ("compiled vnpu / eager vnpu", ratio(s["compiled_vnpu_over_eager_vnpu"]),
         ratio(s["compiled_vnpu_over_eager_vnpu_paired"])),
        ("eager vnpu / eager cpu", ratio(s["eager_vnpu_over_eager_cpu"]), "–"),
    ]
    configs = []
    for device in ("cpu", "vnpu"):
        configs.append((f"eager {device}", num(s["step_ms"][f"eager {device}"]),
                        num(s["first_step_eager_s"][device], 2), "–", "–"))
        configs.append((f"compiled {device}", num(s["step_ms"][f"compiled {device}"]),
                        num(s["first_step_cold_s"][device], 2), num(s["first_step_warm_s"][device], 2),
                        s["recompiles"][device]["graphs"]))
    return table(["step time", "ratio of medians", "median of per-round ratios"], ratios) + table(
        ["configuration", "step ms", "first step s (cold cache)", "first step s (warm cache)",
         "graphs for 10 lengths"], configs) + [
        f"GPT of examples/train_gpt.py, batch {m['batch_size']} × {m['block_size']}, AdamW (foreach); "
        f"{plural(m['rounds'], 'round')} × {plural(m['steps'], 'timed step')} per configuration after "
        f"{plural(m['warmup'], 'warm-up step')}.", ""]


def compile_cpp_wrapper(d):
    c = d["configs"]

    def get(device, cpp):
        return c[f"compiled {device}, {'C++' if cpp else 'Python'} wrapper"]

    ratios = [(f"{'C++' if cpp else 'Python'} wrapper",
               ratio(get("vnpu", cpp)["step_ms"] / get("cpu", cpp)["step_ms"]),
               ratio(get("vnpu", cpp)["step_ms_min"] / get("cpu", cpp)["step_ms_min"]),
               ratio(get("vnpu", cpp)["compile_s"] / get("cpu", cpp)["compile_s"])) for cpp in (False, True)]
    configs = [(f"compiled {device}, {'C++' if cpp else 'Python'} wrapper", num(get(device, cpp)["compile_s"]),
                num(get(device, cpp)["step_ms"], 3), num(get(device, cpp)["step_ms_min"], 3),
                ratio(get(device, cpp)["step_ms"] / get(device, False)["step_ms"]))
               for device in ("cpu", "vnpu") for cpp in (False, True)]
    a = d["args"]
    return table(["wrapper", "step vnpu/cpu (median)", "step vnpu/cpu (minimum)", "cold compile vnpu/cpu"],
                 ratios) + table(["configuration", "cold compile s", "step ms (median)", "step ms (minimum)",
                                  "step vs Python wrapper"], configs) + [
        f"MLP training step (4 × Linear(256) + LayerNorm + GELU), batch {a['batch']}; "
        f"{plural(a['repeats'], 'timing')} of {plural(a['steps'], 'step')} after "
        f"{plural(a['warmup'], 'warm-up step')}.", ""]


def hf_step(d):
    s = d["summary"]
    rows = [(r["model"], r["work"], ratio(r["ratio"]), ratio(r["ratio_per_round_median"]), num(r["cpu_ms"]),
             num(r["vnpu_ms"])) for r in s["rows"]]
    copies = {m: sum(ops.values()) for m, ops in s["extra_copies_per_train_step"].items()}
    a = s["args"]
    return table(["model", "work", "vnpu/cpu", "median of per-round ratios", "cpu ms", "vnpu ms"], rows) + [
        f"{plural(a['rounds'], 'round')} × {plural(a['reps'], 'repetition')} after {a['warmup']} warm-up, "
        f"generate {a['new_tokens']} tokens, {s['torch_num_threads']} torch threads. "
        "Same generated tokens on cpu and vnpu: "
        + ", ".join(f"{m} {'yes' if same else 'no'}" for m, same in s["same_generated_tokens"].items())
        + "; extra-copy ops per training step: " + ", ".join(f"{m} {n}" for m, n in copies.items()) + ".", ""]


def graph_replay(d):
    s = d["summary"]
    rows = [(r["device"], r["variant"], ratio(r["ratio_vs_cpu"]), ratio(r["ratio_per_round_median"]),
             num(r["ms"]), num(r["ms_per_token"], 2), "yes" if r["tokens_equal_cpu"] else "**no**")
            for r in s["rows"]]
    a = s["args"]
    return table(["device", "variant", "vs eager cpu", "median of per-round ratios", "ms per decode",
                  "ms per token", "tokens = cpu"], rows) + [
        f"Greedy decode of {a['new_tokens']} tokens, batch 4; {plural(a['rounds'], 'round')} × "
        f"{plural(a['reps'], 'run')} after {a['warmup']} warm-up, {s['torch_num_threads']} torch threads.", ""]


def decode(d):
    s, m = d["summary"], d["summary"]["model"]
    ratios = [(r["ratio"], ratio(r["ratio_of_medians"]), ratio(r["ratio_per_round_median"]),
               "–" if r["target"] is None else f"≤ {r['target']}",
               "–" if r["target"] is None else ("yes" if r["meets_target"] else "**no**")) for r in s["ratios"]]
    configs = [(f"{r['variant']} {r['device']}", num(r["ms_per_token"], 3), ratio(r["ratio_vs_eager_cpu"]),
                ratio(r["ratio_per_round_median"]), num(r["first_call_s"], 2), num(1e3 * r["second_call_s"]),
                "yes" if r["tokens_equal_cpu"] else "**no**") for r in s["rows"]]
    a = s["args"]
    return table(["ratio", "ratio of medians", "median of per-round ratios", "target", "met"], ratios) + table(
        ["configuration", "ms per token", "vs eager cpu", "median of per-round ratios", "first call s",
         "second call ms", "tokens = cpu"], configs) + [
        f"gpt-fast style Llama ({m['layers']} layers, hidden {m['dim']}, {m['heads']} heads, MLP {m['hidden']}, "
        f"vocab {m['vocab']}, {m['max_seq']}-token static cache), batch {m['batch']}, {m['dtype']}: "
        f"{plural(a['new_tokens'], 'decode call')} after a prompt of {m['prompt']} tokens (the prefill eager and "
        f"untimed); {plural(a['rounds'], 'round')} × {plural(a['reps'], 'run')} after the first run and "
        f"{a['warmup']} warm-up, {s['torch_num_threads']} torch threads. First and second call: each "
        "configuration in a fresh process with an empty Inductor cache, each call synchronized; the first "
        "compiles (reduce-overhead: and is the graph trees' warm-up run), the second records the vnpu graph "
        f"(reduce-overhead). vnpu graphs captured during the timed runs: {s['graph_captures_while_timed']}.", ""]


def port_overhead(d):
    rows = [(f"`{name}`", ratio(r["ratio"]), r["unit"], num(r["plain"], 2), num(r["port"], 2))
            for name, r in d["results"].items()]
    return table(["case", "port / plain vnpu", "unit", "plain vnpu", "port mode"], rows) + [
        f"Median of {plural(d['repeats'], 'timing')}; iterations per timing: "
        + ", ".join(f"{k} {v}" for k, v in d["iters"].items()) + ".", ""]


def _size(n):
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


def collectives(d):
    by = {(r["op"], r["ranks"], r["bytes"], r["backend"]): r for r in d["results"]}
    rows = []
    for (op, ranks, nbytes, backend), v in by.items():
        if backend != "vccl":
            continue
        g = by[(op, ranks, nbytes, "gloo")]
        rows.append((op, ranks, _size(nbytes), ratio(v["seconds"] / g["seconds"]), num(v["busbw_GBps"], 3),
                     num(g["busbw_GBps"], 3), num(v["seconds"] * 1e6, 0), num(g["seconds"] * 1e6, 0)))
    return table(["collective", "ranks", "size per rank", "time vccl/gloo", "vccl busbw GB/s", "gloo busbw GB/s",
                  "vccl µs", "gloo µs"], rows) + [
        f"Bus bandwidth as nccl-tests define it; single-thread memcpy of this machine: "
        f"{d['memcpy_GBps_single_thread']:.2f} GB/s.", ""]


def dist_train_step(d):
    rows = [(r["mode"], r["nproc"], ratio(r["ratio"]), ratio(r["round_ratio_median"]), num(r["cpu_ms"]),
             num(r["vnpu_ms"])) for r in d["results"]]
    a = d["args"]
    return table(["parallelism", "ranks", "vnpu/cpu", "median of per-round ratios", "cpu + gloo ms",
                  "vnpu + vccl ms"], rows) + [
        f"examples/train_gpt_dist.py under torchrun, {plural(a['rounds'], 'round')} of "
        f"{plural(a['steps'], 'synced step')} per device, the first {a['warmup']} of each run dropped.", ""]


def checkpoint_io(d):
    out = []
    for cache, r in d["results"].items():
        def timed(what, rows, r=r):  # median seconds, fastest run, GiB/s (median)
            fastest = r.get("min_seconds", {})
            return table([what, "s (median)", "s (fastest run)", "GiB/s"], [
                (label, num(r["seconds"][k], 3), num(fastest.get(k), 3), num(r["gib_per_s"][k], 2))
                for k, label in rows])

        rows = []
        for k, label in (("read", "reading the files, 16 MiB reads, all at once (storage limit)"),
                         ("cpu", "to CPU memory"),
                         ("vnpu", "to vnpu, read into the device"),
                         ("vnpu_staged", "to vnpu, through pinned staging buffers (`VNPU_FILE_READS=0`)"),
                         ("vnpu_copy", "to vnpu, a copy per tensor (safetensors' own)")):
            if k not in r["seconds"]:
                continue
            rows.append((label, num(r["seconds"][k], 3), num(r.get("min_seconds", {}).get(k), 3),
                         num(r["gib_per_s"][k], 2),
                         num(r["peak_rss_mib"].get(k), 0), num(r["host_overhead_mib"].get(k), 0)))
        note = "" if cache == "warm" else " (the checkpoint's pages evicted before each run)"
        out += [f"{cache.capitalize()} page cache{note}: vnpu / cpu = {ratio(r['vnpu_over_cpu'])}, "
                f"per-tensor copy / cpu = {ratio(r['vnpu_copy_over_cpu'])}, "
                f"{100 * r['read_bandwidth_fraction']:.0f}% of the read bandwidth.", ""]
        out += table(["load", "s (median)", "s (fastest run)", "GiB/s", "peak RSS MiB", "RSS beyond the checkpoint MiB"],
                     rows)
        if "pt_vnpu_over_cpu" in r:
            out += [f"torch.load: vnpu / cpu = {ratio(r['pt_vnpu_over_cpu'])}, per-storage copy / cpu = "
                    f"{ratio(r['pt_vnpu_copy_over_cpu'])}. Writing the same bytes of fresh vnpu memory once (the "
                    f"floor of any load into it) takes {ratio(r['touch_over_cpu'])} the safetensors load to CPU.",
                    ""]
            out += timed("torch.load", (("pt_cpu", "to CPU memory"), ("pt_vnpu", "to vnpu, read into the device"),
                                        ("pt_vnpu_copy", "to vnpu, a copy per storage (torch's own)"),
                                        ("touch", "first write of fresh vnpu memory")))
        if "dcp_vnpu_over_cpu" in r:
            out += [f"torch.distributed.checkpoint.load: vnpu / cpu = {ratio(r['dcp_vnpu_over_cpu'])}, DCP's own "
                    f"reader / cpu = {ratio(r['dcp_vnpu_copy_over_cpu'])}.", ""]
            out += timed("dcp.load", (("dcp_cpu", "into CPU tensors"),
                                      ("dcp_vnpu", "into vnpu tensors, read into the device"),
                                      ("dcp_vnpu_copy", "into vnpu tensors, DCP's own reader (host copy per record)")))
        if "save_vnpu_over_cpu" in r:
            staged = (f", staged (`VNPU_FILE_WRITES=0`) / cpu = {ratio(r['save_vnpu_staged_over_cpu'])}"
                      if "save_vnpu_staged_over_cpu" in r else "")
            out += [f"Saving: vnpu / cpu = {ratio(r['save_vnpu_over_cpu'])}{staged}, per-tensor copy / cpu = "
                    f"{ratio(r['save_vnpu_copy_over_cpu'])}.", ""]
            rows_ = [("save_cpu", "from CPU memory"), ("save_vnpu", "from vnpu, written from device memory")]
            if "save_vnpu_staged" in r["seconds"]:
                rows_.append(("save_vnpu_staged", "from vnpu, through pinned staging buffers (`VNPU_FILE_WRITES=0`)"))
            out += timed("save", (*rows_, ("save_vnpu_copy", "from vnpu, a copy per tensor (before)")))
        if "pt_save_vnpu_over_cpu" in r:
            out += [f"torch.save: vnpu / cpu = {ratio(r['pt_save_vnpu_over_cpu'])}, per-storage copy / cpu = "
                    f"{ratio(r['pt_save_vnpu_copy_over_cpu'])}.", ""]
            out += timed("torch.save", (("pt_save_cpu", "from CPU memory"),
                                        ("pt_save_vnpu", "from vnpu, storages downloaded ahead into pinned buffers"),
                                        ("pt_save_vnpu_copy", "from vnpu, torch's own copy per storage")))
    return out + [f"A {d['checkpoint_bytes'] / MIB:.0f} MiB checkpoint in {plural(d['shards'], 'shard')}; "
                  "each load in a fresh process (median). A vnpu load's RSS includes the device memory (the "
                  "vNPU's memory is the process's).", ""]


def async_save(d):
    m = d["median_s"]
    rows = [(label, num(1e3 * m[k])) for k, label in (
        ("step_s", "training step, no save"), ("save_call_s", "`async_save` call (blocking part: staging)"),
        ("during_s", "training step while the checkpoint is written"),
        ("save_total_s", "`async_save` until written"), ("sync_save_s", "`dcp.save` (blocking), for comparison"))]
    return [f"Training step while writing / without a save: {ratio(d['during_over_step'])} (target ≤ 1.2); "
            f"the checkpoint holds the state of its call: {'yes' if d['checkpoint_as_of_call'] else '**no**'}.",
            ""] + table(["", "ms (median)"], rows) + [
        f"FSDP2 on one rank: {d['layers']} × Linear({d['width']}, {d['width']}) with GELU, AdamW, batch "
        f"{d['batch']}; parameters {d['model_bytes'] / MIB:.0f} MiB (the checkpoint holds the optimizer state "
        f"too). {d['steps_during_saves']} steps ran while checkpoints were written.", ""]


BENCHMARKS = [
    Bench("eager_overhead", "Eager dispatch overhead",
          "Time per call of small ops (a 2x2 add, a 64x64 matmul, an allocation): the per-op cost a Python "
          "training loop pays on vnpu, against the same call on cpu.",
          "python benchmarks/eager_overhead.py", "make bench", eager_overhead),
    Bench("eager_overhead_modes", "Eager dispatch overhead with instrumentation",
          "The same loops with the profiler and the memory history on; the host cost per call against cpu and "
          "against the same loop with nothing on.",
          "python benchmarks/eager_overhead.py --modes off,profiler,memory_history", "", eager_overhead_modes),
    Bench("train_step", "GPT training step",
          "A training step of examples/train_gpt.py's GPT (forward, backward, AdamW), each device in a process of "
          "its own, rounds alternating between them; and the peak tensor memory of one step.",
          "python benchmarks/train_step.py", "make bench", train_step),
    Bench("train_step_sanitize", "GPT training step under the sanitizer",
          "The GPT training step with vnpu under VNPU_SANITIZE (docs/sanitizer.md); compare its ratio with the "
          "one above for the sanitizer's cost.",
          "python benchmarks/train_step.py --sanitize", "", train_step),
    Bench("compile", "torch.compile",
          "The GPT training step compiled with torch.compile (Inductor) on vnpu against the same on CPU tensors, "
          "and both against eager; compile time with a cold and a warm Inductor cache; recompilations over 10 "
          "sequence lengths.",
          "python benchmarks/compile.py", "make bench", compile_),
    Bench("compile_cpp_wrapper", "torch.compile with the C++ wrapper",
          "A small MLP training step compiled with Inductor's C++ wrapper (`cpp_wrapper=True`) and with its "
          "Python wrapper, on vnpu and on cpu.",
          "python benchmarks/compile_cpp_wrapper.py", "", compile_cpp_wrapper),
    Bench("hf_step", "Hugging Face models",
          "A small Llama and a small Mixtral-style MoE from transformers (random weights): a training step and "
          "greedy generation with the dynamic and the static cache.",
          "python benchmarks/hf_step.py", "make bench", hf_step),
    Bench("graph_replay", "Decode with graph replay",
          "A static-cache greedy decode of a small Llama: eager on cpu, eager on vnpu, and on vnpu with each "
          "decode step captured once (torch.vnpu.graph) and replayed per token.",
          "python benchmarks/graph_replay.py", "make bench", graph_replay),
    Bench("decode", "Decode with torch.compile(mode=\"reduce-overhead\")",
          "A gpt-fast style greedy decode of a small Llama with a static KV cache, time per token: eager and "
          "compiled on cpu; eager, compiled, and compiled with `mode=\"reduce-overhead\"` (Inductor's graph trees "
          "record the decode step as a vnpu graph once and replay it per token) on vnpu. Targets: "
          "reduce-overhead vnpu at most 0.5 × eager cpu and 0.8 × compiled cpu.",
          "python benchmarks/decode.py", "make bench", decode),
    Bench("port_overhead", "CUDA port mode",
          "The cost of port mode (torch_vnpu.port): the same vnpu work with `device=\"cuda\"` through port mode "
          "against plain vnpu. The ratio here is port mode / plain vnpu, not vnpu / cpu.",
          "python benchmarks/port_overhead.py", "make bench", port_overhead),
    Bench("checkpoint_io", "Checkpoint loading and saving",
          "A checkpoint loaded onto vnpu by safetensors, torch.load and torch.distributed.checkpoint (torch_vnpu."
          "checkpoints: the files read straight into device memory, reads in flight) against the same load into CPU "
          "memory and against reading the files, on a warm and a cold page cache; and saved from vnpu by safetensors "
          "(written from device memory) and torch.save (downloads into pinned buffers, written as each lands) "
          "against saving it from CPU memory. Medians of fresh processes, with the fastest run beside them: the cold "
          "reads, and the large writes of the CPU and staged saves, vary from run to run on this machine.",
          "python benchmarks/checkpoint_io.py", "make bench", checkpoint_io),
    Bench("async_save", "Training during an asynchronous checkpoint",
          "torch.distributed.checkpoint.async_save of an FSDP2 model on vnpu: the training steps that run while "
          "the checkpoint is written, against steps without a save.",
          "python benchmarks/async_save.py", "make bench", async_save),
    Bench("collectives", "Collectives",
          "Collectives of vccl on vnpu tensors against gloo on CPU tensors, in the same processes. The ratio is "
          "the time per operation, vccl / gloo (below 1: vccl is faster).",
          "python benchmarks/collectives.py", "make bench-dist", collectives),
    Bench("dist_train_step", "Distributed training step",
          "examples/train_gpt_dist.py under torchrun with DDP and FSDP: vnpu with vccl against CPU with gloo.",
          "python benchmarks/dist_train_step.py", "make bench-dist", dist_train_step),
]


def run_lines(run):
    """The run's metadata as a bullet list (benchmarks/_meta.py's fields)."""
    if not run:
        return ["Run metadata: not in this JSON (written before benchmarks/_meta.py); rerun the benchmark.", ""]
    load_b = ", ".join(f"{x:.2f}" for x in run["load_average_before"])
    load_a = ", ".join(f"{x:.2f}" for x in run["load_average_after"])
    lines = [
        f"- Machine: {run['cpu_model']}, {run['cpu_count']} logical CPUs ({run['platform']})",
        f"- Date: {run['date'].replace('T', ' ')}, took {run['duration_s']:.0f} s",
        f"- Command: `{run['command']}`",
        f"- Load average (1, 5, 15 min): {load_b} before the run, {load_a} after",
        f"- Versions: torch {run['torch']}, torch_vnpu {run['torch_vnpu']}"
        + (f" (source tree at commit {run['commit']})" if run.get("commit") else "") + f", Python {run['python']}",
    ]
    # A load above the core count means other work shared the cores: both devices slow down, unevenly.
    if max(run["load_average_before"][0], run["load_average_after"][0]) > run["cpu_count"]:
        lines.append(f"- Measured under load (load average above {run['cpu_count']} CPUs): the figures are noisy")
    return lines + [""]


def section(b, data, in_dir):
    lines = [f"## {b.title}", "", b.what, ""]
    if data is None:
        return lines + [f"Not run yet: `{b.command} --out {in_dir}`, then `make bench-page`.", ""]
    try:
        body = b.render(data)
    except (KeyError, TypeError, ZeroDivisionError) as e:
        raise SystemExit(f"{b.name}.json: not the format scripts/bench_page.py reads ({e!r}); update its renderer")
    source = f"From `{b.name}.json`" + (f" (`{b.make}`)." if b.make else " (not part of `make bench`).")
    return lines + body + [source, ""] + run_lines(data.get("run"))


def other_section(name, data):
    """A benchmark JSON this script has no renderer for: its metadata, and a note to add one."""
    note = f"`{name}.json` has no table renderer in scripts/bench_page.py yet."
    return [f"## {name}", "", note, ""] + run_lines(data.get("run"))


INTRO = """\
<!-- Generated by scripts/bench_page.py from the benchmarks' JSON; do not edit: `make bench-page` rewrites it. -->

# Benchmarks

The vNPU runs on the host CPU, so each benchmark runs the same work twice in one run: on vnpu, and on PyTorch's
own CPU backend. The figure given first is the ratio **vnpu time / CPU time** (below 1: vnpu is faster; 1: the
backend costs nothing over running the same kernels on the CPU directly); absolute times and the settings
follow. Two sections compare something else, and say so: CUDA port mode (against plain vnpu) and the
collectives (vccl on vnpu against gloo on CPU). Each section gives the machine, date, command and load
average of its run: on a shared machine the load changes every number, and a short run (few rounds, as the
command shows) is noisier than one with the defaults.

Every figure on this page is read from the JSON files the scripts under `benchmarks/` write
(`out/bench/<name>.json`) by `scripts/bench_page.py`; none is typed by hand. To regenerate:

- `make bench` runs the single-process benchmarks into `out/bench` and rewrites this page
  (`make bench-dist` the distributed ones);
- `make bench-page` rewrites the page from the JSON already in `out/bench`, e.g. after running one benchmark
  by its command.
"""


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--in", dest="in_dir", default="out/bench", help="directory of the benchmarks' JSON")
    p.add_argument("--out", default="docs/benchmarks.md", help="the page to write")
    args = p.parse_args(argv)

    found = {}
    for path in sorted(glob.glob(os.path.join(args.in_dir, "*.json"))):
        with open(path) as f:
            found[os.path.splitext(os.path.basename(path))[0]] = json.load(f)
    known = {b.name for b in BENCHMARKS}
    lines = [INTRO]
    for b in BENCHMARKS:
        lines += section(b, found.get(b.name), args.in_dir)
    # Other JSON in the directory: only benchmark output (it has the "run" record), not e.g. a training log.
    for name, data in found.items():
        if name not in known and isinstance(data, dict) and "run" in data:
            lines += other_section(name, data)
    text = "\n".join(lines).rstrip("\n") + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    ran = [b.name for b in BENCHMARKS if b.name in found]
    print(f"wrote {args.out}: {len(ran)} of {len(BENCHMARKS)} benchmarks with results ({', '.join(ran) or 'none'})")


if __name__ == "__main__":
    sys.exit(main())
