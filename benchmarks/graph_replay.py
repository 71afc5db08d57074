"""Decode with graph replay (issue #15): a static-cache greedy decode loop of a small Llama, eager on cpu, eager on
vnpu, and on vnpu with each decode step captured once (torch.vnpu.graph) and replayed per token, in one run.

Model: transformers' LlamaForCausalLM with random weights (seeded; float32), the issue's size: 4 layers, hidden
256, 4 heads, intermediate 688, vocab 1000. Work (one "decode"): a batch of 4 prompts of 16 tokens, prefill into a
StaticCache (max length 16 + --new-tokens), then --new-tokens - 1 greedy decode steps. A decode step is the
model's forward on the last token, argmax, and the bookkeeping (next input ids, cache position, the token
written into an output buffer), all device ops; "graph" captures that whole step once (outside the timing) and
runs each step as one replay; the prefill stays eager in every variant. Every variant ends with a
synchronization, and every variant's tokens must equal the cpu ones (checked, printed, recorded).
Each device runs in a process of its own. After --warmup untimed runs, --rounds rounds each time --reps runs of
every variant (cpu and vnpu alternating, so drift hits both); medians over all runs, and the median of
per-round ratios. The load average before and after is recorded.

Writes OUT/graph_replay.json and prints a table.

    python benchmarks/graph_replay.py --out out/bench [--rounds 5 --reps 3 --warmup 2 --new-tokens 32]
"""

import argparse
import json
import os
import platform
import statistics
import time

import _meta
from _procs import alternate_rounds, start_processes

VARIANTS = {"cpu": ("eager",), "vnpu": ("eager", "graph")}


class Decoder:
    """The model, its static cache and the static tensors a captured step reads and writes."""

    def __init__(self, device, args):
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

        self.torch = torch
        self.device = torch.device(device)
        torch.manual_seed(0)
        cfg = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
                          num_key_value_heads=4, vocab_size=1000, max_position_embeddings=256)
        self.model = LlamaForCausalLM(cfg).eval().to(self.device)
        g = torch.Generator().manual_seed(1)
        self.prompt = torch.randint(1, 1000, (4, 16), generator=g).to(self.device)
        self.n = args.new_tokens
        self.p = self.prompt.shape[1]
        self.cache = StaticCache(config=cfg, max_cache_len=self.p + self.n)
        self.ids = torch.zeros(4, 1, dtype=torch.long, device=self.device)
        self.pos = torch.zeros(1, dtype=torch.long, device=self.device)
        self.out = torch.zeros(4, self.n, dtype=torch.long, device=self.device)
        self.graph = None

    def step(self):
        """One decode step: forward on self.ids at self.pos, greedy token into self.out, advance."""
        logits = self.model(input_ids=self.ids, cache_position=self.pos, past_key_values=self.cache,
                            use_cache=True).logits
        tok = logits[:, -1:].argmax(-1)
        self.out.index_copy_(1, self.pos - (self.p - 1), tok)
        self.ids.copy_(tok)
        self.pos.add_(1)

    def prefill(self):
        self.cache.reset()  # in place (the cache's tensors, its write position included, keep their addresses)
        logits = self.model(input_ids=self.prompt, cache_position=self.torch.arange(self.p, device=self.device),
                            past_key_values=self.cache, use_cache=True).logits
        tok = logits[:, -1:].argmax(-1)
        self.out[:, :1].copy_(tok)
        self.ids.copy_(tok)
        self.pos.fill_(self.p)

    def capture(self):
        torch = self.torch
        with torch.no_grad():
            self.prefill()
            s = torch.vnpu.Stream()
            s.wait_stream(torch.vnpu.current_stream())
            with torch.vnpu.stream(s):  # warm-up outside the capture, as CUDA's docs ask
                self.step()
            torch.vnpu.current_stream().wait_stream(s)
            self.prefill()
            self.graph = torch.vnpu.VNPUGraph()
            with torch.vnpu.graph(self.graph):
                self.step()

    def run(self, variant):
        with self.torch.no_grad():
            self.prefill()
            for _ in range(self.n - 1):
                if variant == "graph":
                    self.graph.replay()
                else:
                    self.step()
        if self.device.type == "vnpu":
            self.torch.vnpu.synchronize(self.device)
        return self.out


def device_process(device, args, conn):
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    dec = Decoder(device, args)
    if "graph" in VARIANTS[device]:
        dec.capture()
    tokens = {}
    for v in VARIANTS[device]:
        for _ in range(args.warmup):
            dec.run(v)
        tokens[v] = dec.run(v).cpu().tolist()
    conn.send("ready")
    times = {v: [] for v in VARIANTS[device]}
    while conn.recv() == "round":
        for v in VARIANTS[device]:
            for _ in range(args.reps):
                t0 = time.perf_counter()
                dec.run(v)
                times[v].append(time.perf_counter() - t0)
        conn.send("done")
    conn.send({"times_s": times, "tokens": tokens, "torch_num_threads": torch.get_num_threads()})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=3, help="timed runs of each variant per round")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--out", default="out/bench")
    run_meta = _meta.begin(__file__, argv)
    args = p.parse_args(argv)

    load_start = os.getloadavg()
    procs, conns = start_processes(VARIANTS, device_process, lambda device: (device, args))
    results = alternate_rounds(procs, conns, args.rounds)
    load_end = os.getloadavg()

    cpu_t = results["cpu"]["times_s"]["eager"]
    rows = []
    for device, variants in VARIANTS.items():
        for v in variants:
            t = results[device]["times_s"][v]
            per_round = [statistics.median(t[i:i + args.reps]) / statistics.median(cpu_t[i:i + args.reps])
                         for i in range(0, len(cpu_t), args.reps)]
            rows.append({"device": device, "variant": v, "ms": 1e3 * statistics.median(t),
                         "ms_per_token": 1e3 * statistics.median(t) / args.new_tokens,
                         "ratio_vs_cpu": statistics.median(t) / statistics.median(cpu_t),
                         "ratio_per_round_median": statistics.median(per_round),
                         "tokens_equal_cpu": results[device]["tokens"][v] == results["cpu"]["tokens"]["eager"]})
    summary = {"rows": rows, "load_average_start": load_start, "load_average_end": load_end,
               "torch_num_threads": results["cpu"]["torch_num_threads"], "args": vars(args),
               "machine": platform.platform(), "cpu_count": os.cpu_count()}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "graph_replay.json")
    with open(path, "w") as f:
        json.dump({"run": _meta.end(run_meta), "summary": summary, "raw": results}, f, indent=1)

    print(f"\nload average {load_start[0]:.2f} -> {load_end[0]:.2f}; {summary['torch_num_threads']} threads; "
          f"decode of {args.new_tokens} tokens, batch 4")
    print(f"{'device':6s} {'variant':8s} {'ms':>8s} {'ms/token':>9s} {'vs cpu':>7s} {'per round':>9s} {'tokens = cpu':>12s}")
    for r in rows:
        print(f"{r['device']:6s} {r['variant']:8s} {r['ms']:8.1f} {r['ms_per_token']:9.2f} {r['ratio_vs_cpu']:7.3f} "
              f"{r['ratio_per_round_median']:9.3f} {str(r['tokens_equal_cpu']):>12s}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
