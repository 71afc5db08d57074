"""Decode with torch.compile(mode="reduce-overhead") (issue #35): per-token time of a gpt-fast style greedy decode
loop, eager and compiled on cpu, eager, compiled and compiled with mode="reduce-overhead" (Inductor's graph
trees recording and replaying vnpu graphs) on vnpu, in one run.

Model: the shape of pytorch-labs/gpt-fast's model.py (as tests/test_compile_graphs.py, defined here): a Llama
with a static KV cache written with index_put at input_pos, RoPE, SDPA with a mask row; the issue's size:
4 layers, hidden 256, 4 heads, MLP hidden 688, vocab 1000, a 128-token cache; random weights (seeded), float32,
batch 1. Work (one "decode"): an 8-token prompt prefilled eagerly (untimed, then synchronized), then the timed
loop: --new-tokens calls of decode_one_token (the model on the last token, argmax), each on a clone of the last
token at input_pos, input_pos += 1, and at the end torch.cat of the tokens and .cpu() (the synchronization).
Variants: "compiled" = torch.compile(decode_one_token, fullgraph=True); "reduce-overhead" = the same with
mode="reduce-overhead" (the first call is the warm-up run, the second records the graph, every later call
replays it). Every variant's tokens (prefill's and decode's) must equal eager cpu's: checked for every run,
recorded, printed, and the script exits with an error if any differ.
Each device runs in a process of its own, every variant of it on its own copy of the model. After the first
decode (compilations included) and --warmup untimed decodes, --rounds rounds each time --reps decodes of every
variant (cpu and vnpu alternating, so drift hits both); medians over all runs, and the median of per-round
ratios. First calls: before that, each variant in a fresh process with an empty Inductor cache times its first
three decode calls (each synchronized): the first compiles and runs (reduce-overhead: the warm-up run), the
second records the graph for reduce-overhead. The load average before and after is recorded.

Writes OUT/decode.json and prints a table.

    python benchmarks/decode.py --out out/bench [--rounds 5 --reps 3 --warmup 2 --new-tokens 64]
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time

import _meta
from _procs import alternate_rounds, run_in_process, start_processes

VARIANTS = {"cpu": ("eager", "compiled"), "vnpu": ("eager", "compiled", "reduce-overhead")}
PROMPT, MAX_SEQ = 8, 128
# (numerator, denominator, target): the targets for reduce-overhead; the others for reference.
RATIOS = [(("vnpu", "reduce-overhead"), ("cpu", "eager"), 0.5),
          (("vnpu", "reduce-overhead"), ("cpu", "compiled"), 0.8),
          (("vnpu", "eager"), ("cpu", "eager"), None),
          (("vnpu", "compiled"), ("cpu", "compiled"), None),
          (("vnpu", "reduce-overhead"), ("vnpu", "compiled"), None)]


def label(device, variant):
    return f"{variant} {device}"


class Decoder:
    """One variant on one device: its own model (and KV cache), its decode function, the prompt."""

    def __init__(self, device, variant):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        from torch_vnpu.testing.static_cache_llama import Transformer, decode_one_token

        self.decode_one_token = decode_one_token
        torch.manual_seed(0)
        self.model = Transformer(vocab=1000, dim=256, layers=4, heads=4, hidden=688, max_seq=MAX_SEQ).eval().to(
            self.device)
        self.prompt = torch.randint(1, 1000, (1, PROMPT), generator=torch.Generator().manual_seed(1)).to(self.device)
        if variant == "eager":
            self.decode = self.decode_one_token
        else:
            kwargs = {"mode": "reduce-overhead"} if variant == "reduce-overhead" else {}
            self.decode = torch.compile(self.decode_one_token, fullgraph=True, **kwargs)

    def sync(self):
        if self.device.type == "vnpu":
            self.torch.vnpu.synchronize(self.device)

    def prefill(self):
        """The prompt through the model, eager in every variant; returns the first token and the next position."""
        torch = self.torch
        with torch.no_grad():
            token = self.decode_one_token(self.model, self.prompt, torch.arange(PROMPT, device=self.device))
            pos = torch.tensor([PROMPT], device=self.device)
        self.sync()
        return token, pos

    def step(self, token, pos):
        with self.torch.no_grad():
            token = self.decode(self.model, token.clone(), pos).clone()
            pos += 1
        return token

    def run(self, n):
        """One decode: prefill (untimed), then n decode calls, timed to the tokens on the host.
        Returns (seconds, all tokens as a list)."""
        token, pos = self.prefill()
        first = token
        t0 = time.perf_counter()
        tokens = []
        for _ in range(n):
            token = self.step(token, pos)
            tokens.append(token)
        out = self.torch.cat(tokens, 1).cpu()
        seconds = time.perf_counter() - t0
        return seconds, first.cpu().flatten().tolist() + out.flatten().tolist()


def _count_captures(torch):
    """A counter of vnpu graph captures (VNPUGraph.capture_end calls); the graph-tree manager captures one empty
    graph of its own to keep its memory pool alive (as on CUDA), so recordings = captures - 1 once it exists."""
    calls = {"captures": 0}
    capture_end = torch.vnpu.VNPUGraph.capture_end

    def counted(g):
        calls["captures"] += 1
        return capture_end(g)

    torch.vnpu.VNPUGraph.capture_end = counted
    return calls


def first_calls_process(device, variant, args, cache_dir, conn):
    """A fresh process and an empty Inductor cache: the wall time of the first three decode calls, each
    synchronized (tokens to the host), and the graph captures after each."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    dec = Decoder(device, variant)
    calls = _count_captures(torch) if device == "vnpu" else None
    token, pos = dec.prefill()
    seconds, captures = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        token = dec.step(token, pos)
        token.cpu()
        seconds.append(time.perf_counter() - t0)
        captures.append(calls["captures"] if calls else None)
    conn.send({"seconds": seconds, "graph_captures_after": captures})


def device_process(device, args, cache_dir, conn):
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    calls = _count_captures(torch) if device == "vnpu" else None
    decoders = {v: Decoder(device, v) for v in VARIANTS[device]}
    tokens, first_run_s, differ = {}, {}, {v: 0 for v in VARIANTS[device]}
    for v, dec in decoders.items():
        first_run_s[v], tokens[v] = dec.run(args.new_tokens)  # compilations (and the recording) included
        for _ in range(args.warmup):
            differ[v] += dec.run(args.new_tokens)[1] != tokens[v]
    captures_before = calls["captures"] if calls else None
    conn.send("ready")
    times = {v: [] for v in VARIANTS[device]}
    while conn.recv() == "round":
        for v, dec in decoders.items():
            for _ in range(args.reps):
                seconds, toks = dec.run(args.new_tokens)
                times[v].append(seconds)
                differ[v] += toks != tokens[v]
        conn.send("done")
    conn.send({"times_s": times, "tokens": tokens, "runs_with_other_tokens": differ, "first_run_s": first_run_s,
               "graph_captures_while_timed": calls["captures"] - captures_before if calls else None,
               "torch_num_threads": torch.get_num_threads()})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=3, help="timed decodes of each variant per round")
    p.add_argument("--warmup", type=int, default=2, help="untimed decodes after the first (compiling) one")
    p.add_argument("--new-tokens", type=int, default=64, help=f"decode calls per decode (at most {MAX_SEQ - PROMPT})")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--out", default="out/bench")
    run_meta = _meta.begin(__file__, argv)
    args = p.parse_args(argv)
    if not 1 <= args.new_tokens <= MAX_SEQ - PROMPT:
        p.error(f"--new-tokens must be in 1..{MAX_SEQ - PROMPT} (a {PROMPT}-token prompt, a {MAX_SEQ}-token cache)")

    load_start = os.getloadavg()
    tmp = tempfile.mkdtemp(prefix="bench-decode-")
    first_calls = {}
    for device, variants in VARIANTS.items():  # one at a time: cold compilations do not overlap
        for v in variants:
            cache = os.path.join(tmp, f"{v}-{device}")
            first_calls[label(device, v)] = run_in_process(first_calls_process, device, v, args, cache)
            print(f"[{label(device, v)}] first calls (s): "
                  + ", ".join(f"{s:.3f}" for s in first_calls[label(device, v)]["seconds"]), flush=True)

    # The cache the fresh "compiled" process filled: the compilations here start warm.
    procs, conns = start_processes(VARIANTS, device_process,
                                   lambda device: (device, args, os.path.join(tmp, f"compiled-{device}")))
    results = alternate_rounds(procs, conns, args.rounds)
    load_end = os.getloadavg()
    shutil.rmtree(tmp, ignore_errors=True)

    def times(key):
        return results[key[0]]["times_s"][key[1]]

    def per_round(num, den):
        a, b, k = times(num), times(den), args.reps
        return [statistics.median(a[i:i + k]) / statistics.median(b[i:i + k]) for i in range(0, len(b), k)]

    cpu_tokens = results["cpu"]["tokens"]["eager"]
    rows = []
    for device, variants in VARIANTS.items():
        for v in variants:
            t, fc = times((device, v)), first_calls[label(device, v)]
            rows.append({"device": device, "variant": v, "ms": 1e3 * statistics.median(t),
                         "ms_per_token": 1e3 * statistics.median(t) / args.new_tokens,
                         "ratio_vs_eager_cpu": statistics.median(t) / statistics.median(times(("cpu", "eager"))),
                         "ratio_per_round_median": statistics.median(per_round((device, v), ("cpu", "eager"))),
                         "tokens_equal_cpu": (results[device]["tokens"][v] == cpu_tokens
                                              and results[device]["runs_with_other_tokens"][v] == 0),
                         "first_call_s": fc["seconds"][0], "second_call_s": fc["seconds"][1],
                         "third_call_s": fc["seconds"][2], "first_two_calls_s": sum(fc["seconds"][:2]),
                         "graph_captures_after_first_calls": fc["graph_captures_after"],
                         "first_decode_s": results[device]["first_run_s"][v]})
    ratios = []
    for num, den, target in RATIOS:
        r = statistics.median(times(num)) / statistics.median(times(den))
        ratios.append({"ratio": f"{label(*num)} / {label(*den)}", "numerator": label(*num),
                       "denominator": label(*den), "ratio_of_medians": r,
                       "ratio_per_round_median": statistics.median(per_round(num, den)), "target": target,
                       "meets_target": None if target is None else r <= target})
    summary = {"rows": rows, "ratios": ratios, "load_average_start": load_start, "load_average_end": load_end,
               "graph_captures_while_timed": results["vnpu"]["graph_captures_while_timed"],
               "torch_num_threads": results["cpu"]["torch_num_threads"], "args": vars(args),
               "model": {"layers": 4, "dim": 256, "heads": 4, "hidden": 688, "vocab": 1000, "max_seq": MAX_SEQ,
                         "prompt": PROMPT, "batch": 1, "dtype": "float32"},
               "machine": platform.platform(), "cpu_count": os.cpu_count()}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "decode.json")
    with open(path, "w") as f:
        json.dump({"run": _meta.end(run_meta), "summary": summary, "raw": {"timing": results,
                                                                           "first_calls": first_calls}}, f, indent=1)

    print(f"\nload average {load_start[0]:.2f} -> {load_end[0]:.2f}; {summary['torch_num_threads']} threads; "
          f"decode of {args.new_tokens} tokens after an {PROMPT}-token prompt, batch 1")
    print(f"{'configuration':22s} {'ms/token':>9s} {'vs eager cpu':>12s} {'per round':>9s} {'1st call s':>10s} "
          f"{'2nd call ms':>11s} {'tokens = cpu':>12s}")
    for r in rows:
        print(f"{label(r['device'], r['variant']):22s} {r['ms_per_token']:9.3f} {r['ratio_vs_eager_cpu']:12.3f} "
              f"{r['ratio_per_round_median']:9.3f} {r['first_call_s']:10.2f} {1e3 * r['second_call_s']:11.1f} "
              f"{str(r['tokens_equal_cpu']):>12s}")
    print()
    for r in ratios:
        target = "" if r["target"] is None else (f"  (target <= {r['target']}: "
                                                 f"{'met' if r['meets_target'] else 'NOT met'})")
        print(f"{r['ratio']:40s} {r['ratio_of_medians']:6.3f}  per round {r['ratio_per_round_median']:6.3f}{target}")
    print(f"vnpu graph captures while timed (0: every reduce-overhead call replayed): "
          f"{summary['graph_captures_while_timed']}")
    print(f"wrote {path}")
    bad = [label(r["device"], r["variant"]) for r in rows if not r["tokens_equal_cpu"]]
    if bad:
        raise SystemExit(f"tokens differ from eager cpu's: {', '.join(bad)} (see {path})")


if __name__ == "__main__":
    main()
