"""Real-model eager speed (issue #15): a small Llama and a small MoE from transformers, vnpu vs cpu, in one run.

Models (random weights, seeded; float32): "llama" = LlamaForCausalLM with 4 layers, hidden 256, 4 heads,
intermediate 688, vocab 1000 (the issue's model); "moe" = MixtralForCausalLM with 2 layers, hidden 256,
4 heads, 4 experts (2 per token), intermediate 512, vocab 1000.
Work per model and device:
  train     one AdamW training step on a batch of 4 x 128 tokens (forward with labels, backward, step,
            zero_grad), followed by a synchronize;
  generate  greedy `generate()` of --new-tokens tokens from a 4 x 16 prompt, with the dynamic cache and
            with the static cache (`cache_implementation="static"`), followed by a synchronize;
  copies    vnpu only: `torch.vnpu.get_extra_copy_ops()` counted over one training step (ops that ran a
            functional kernel plus a copy instead of writing into device memory).
Each device runs in a process of its own (as a user's job; see benchmarks/train_step.py). After --warmup
untimed repetitions, --rounds rounds each time --reps repetitions on cpu and then on vnpu (alternating, so
drift in the machine's speed hits both alike); medians over all rounds, and the median of per-round ratios.
The load average before and after is recorded: on a busy machine every number is several times slower.

Writes OUT/hf_step.json and prints a table.

    python benchmarks/hf_step.py --out out/bench [--rounds 5 --reps 3 --warmup 2 --new-tokens 32]
"""

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import time

import _meta
from _procs import receive

MODELS = ("llama", "moe")
WORK = ("train", "generate_dynamic", "generate_static")
DEVICES = ("cpu", "vnpu")


def build(name, device):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    if name == "llama":
        cfg = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
                          num_key_value_heads=4, vocab_size=1000, max_position_embeddings=256)
        model = LlamaForCausalLM(cfg)
    else:
        cfg = MixtralConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=4, num_local_experts=4, num_experts_per_tok=2, vocab_size=1000,
                            max_position_embeddings=256)
        model = MixtralForCausalLM(cfg)
    model.generation_config.pad_token_id = 0
    return model.to(device)


class Job:
    """One model on one device: the timed closures and their synchronization."""

    def __init__(self, name, device, args):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.model = build(name, self.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        g = torch.Generator().manual_seed(1)
        self.batch = torch.randint(0, 1000, (4, 128), generator=g).to(self.device)
        self.prompt = torch.randint(1, 1000, (4, 16), generator=g).to(self.device)
        self.new_tokens = args.new_tokens

    def sync(self):
        if self.device.type == "vnpu":
            self.torch.vnpu.synchronize(self.device)

    def train(self):
        self.model.train()
        self.model(input_ids=self.batch, labels=self.batch).loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def generate(self, static):
        self.model.eval()
        kwargs = {"cache_implementation": "static"} if static else {}
        with self.torch.no_grad():
            return self.model.generate(self.prompt, max_new_tokens=self.new_tokens, min_new_tokens=self.new_tokens,
                                       do_sample=False, **kwargs)

    def run(self, work):
        if work == "train":
            self.train()
        else:
            self.generate(work == "generate_static")
        self.sync()


def device_process(device, args, conn):
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    jobs = {m: Job(m, device, args) for m in MODELS}
    result = {"tokens": {}, "extra_copies_per_train_step": {}}
    for m, job in jobs.items():
        for w in WORK:
            for _ in range(args.warmup):
                job.run(w)
        # the generated tokens, to check both devices produce the same text
        result["tokens"][m] = {s: job.generate(s == "static").cpu().tolist() for s in ("dynamic", "static")}
        if device == "vnpu":
            before = dict(torch.vnpu.get_extra_copy_ops())
            job.run("train")
            after = torch.vnpu.get_extra_copy_ops()
            result["extra_copies_per_train_step"][m] = {
                op: n - before.get(op, 0) for op, n in after.items() if n - before.get(op, 0) > 0}
    conn.send("ready")
    times = {m: {w: [] for w in WORK} for m in MODELS}
    while conn.recv() == "round":
        for m, job in jobs.items():
            for w in WORK:
                for _ in range(args.reps):
                    t0 = time.perf_counter()
                    job.run(w)
                    times[m][w].append(time.perf_counter() - t0)
        conn.send("done")
    result["times_s"] = times
    result["torch_num_threads"] = torch.get_num_threads()
    conn.send(result)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=3, help="timed repetitions of each work item per round")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--out", default="out/bench")
    run_meta = _meta.begin(__file__, argv)
    args = p.parse_args(argv)

    load_start = os.getloadavg()
    ctx = multiprocessing.get_context("spawn")
    procs, conns = [], []
    for device in DEVICES:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=device_process, args=(device, args, child), daemon=True, name=device)
        proc.start()
        receive(parent, proc)
        print(f"[{device}] ready", flush=True)
        procs.append(proc)
        conns.append(parent)
    for r in range(args.rounds):
        for c, proc in zip(conns, procs):
            c.send("round")
            receive(c, proc)
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    results = {}
    for device, c, proc in zip(DEVICES, conns, procs):
        c.send("stop")
        results[device] = receive(c, proc)
        proc.join()
    load_end = os.getloadavg()

    rows = []
    for m in MODELS:
        for w in WORK:
            cpu_t, vnpu_t = results["cpu"]["times_s"][m][w], results["vnpu"]["times_s"][m][w]
            per_round = [statistics.median(vnpu_t[i:i + args.reps]) / statistics.median(cpu_t[i:i + args.reps])
                         for i in range(0, len(cpu_t), args.reps)]
            rows.append({"model": m, "work": w, "cpu_ms": 1e3 * statistics.median(cpu_t),
                         "vnpu_ms": 1e3 * statistics.median(vnpu_t),
                         "ratio": statistics.median(vnpu_t) / statistics.median(cpu_t),
                         "ratio_per_round_median": statistics.median(per_round)})
    same_tokens = {m: results["cpu"]["tokens"][m] == results["vnpu"]["tokens"][m] for m in MODELS}
    summary = {"rows": rows, "same_generated_tokens": same_tokens,
               "extra_copies_per_train_step": results["vnpu"]["extra_copies_per_train_step"],
               "load_average_start": load_start, "load_average_end": load_end,
               "torch_num_threads": results["cpu"]["torch_num_threads"], "args": vars(args),
               "machine": platform.platform(), "cpu_count": os.cpu_count()}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "hf_step.json")
    with open(path, "w") as f:
        json.dump({"run": _meta.end(run_meta), "summary": summary, "raw": results}, f, indent=1)

    print(f"\nload average {load_start[0]:.2f} -> {load_end[0]:.2f}; {summary['torch_num_threads']} threads")
    print(f"{'model':6s} {'work':18s} {'cpu ms':>9s} {'vnpu ms':>9s} {'vnpu/cpu':>9s} {'per round':>9s}")
    for r in rows:
        print(f"{r['model']:6s} {r['work']:18s} {r['cpu_ms']:9.1f} {r['vnpu_ms']:9.1f} {r['ratio']:9.3f} "
              f"{r['ratio_per_round_median']:9.3f}")
    print(f"same generated tokens on cpu and vnpu: {same_tokens}")
    for m, ops in summary["extra_copies_per_train_step"].items():
        listed = ", ".join(f"{op} x{n}" for op, n in sorted(ops.items(), key=lambda kv: -kv[1])) or "none"
        print(f"extra-copy ops per {m} training step: {listed}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
