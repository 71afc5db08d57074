"""Soak: the GPT training loop of examples/train_gpt.py on vnpu for a chosen time, with random faults injected.

Training runs in cycles of --cycle-steps steps, each from the same initial weights and a fresh AdamW, so the
oracle is one CPU reference run of a cycle (computed first, in this process): step i of every cycle must give
the CPU's loss for step i (bitwise; "lost" beyond a relative 1e-5). Before a step that gets a fault, the model
and optimizer state are snapshotted on the device; when the fault fires, the step is abandoned, the snapshot
restored and the step run again. Faults (one per faulty step, chosen at random, --fault-rate of the steps):

  oom        a forward hook on a random block allocates more than the device's capacity: torch.OutOfMemoryError
             mid-forward (after the allocator's release-and-retry, which synchronizes with queued work)
  index      a forward hook gathers with an out-of-range index on the device: the error is raised at the call
             or, like CUDA's device-side asserts, at the next synchronization; either way exactly once
  interrupt  a timer signal (setitimer/SIGALRM, whose handler raises KeyboardInterrupt) at a random moment of
             the step: in Python code, in an op, or in a blocking wait for the device (Ctrl-C support)
  thread     a second thread synchronizes the device, queries streams and events and runs checked matmuls on a
             stream of its own while the step runs (nothing should fail)

After every fault the script checks that training resumes with the CPU's losses, that no error is left pending,
that memory_allocated() at the step boundary is what it was before any fault, that after empty_cache() the
allocator's books (memory_reserved(), memory_snapshot()) equal the runtime's count of used device memory and
return to their baseline, and that the process's RSS has not grown beyond --rss-tolerance-mb. It prints the
counts (faults injected, fired, recovered, lost) and writes them as JSON.

    cd tests && ../.venv/bin/python ../scripts/soak.py --minutes 30 --json ../out/soak.json
"""

import argparse
import json
import os
import platform
import random
import signal
import sys
import threading
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import train_gpt  # noqa: E402  (examples/train_gpt.py)

MiB = 1 << 20
FAULTS = ("oom", "index", "interrupt", "thread")


class TimerInterrupt(KeyboardInterrupt):
    """The soak's own interrupt (a real Ctrl-C, a plain KeyboardInterrupt, still stops the soak)."""


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def books_match(device=0) -> bool:
    free, total = torch.vnpu.mem_get_info(device)
    segments = [s for s in torch.vnpu.memory_snapshot() if s["device"] == device]
    return sum(s["total_size"] for s in segments) == torch.vnpu.memory_reserved(device) == total - free


class Soak:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.device = torch.device("vnpu:0")
        self.train_ids, _, vocab = train_gpt.load_corpus()
        self.vocab_size = len(vocab)
        self.block_size = train_gpt.GPTConfig.block_size
        self.counts = {f: {"injected": 0, "fired": 0, "recovered": 0, "lost": 0} for f in FAULTS}
        self.problems = []  # descriptions of every failed check ("anything lost")
        self.steps = 0
        self.cycles = 0
        self.not_bitwise = 0
        self.max_rel_diff = 0.0
        self.armed = False
        self.interrupt_sites = {}  # source line of the step where a timer interrupt landed -> count
        self.recent = []  # durations (s) of recent fault-free steps: where in a step the timer may fire
        signal.signal(signal.SIGALRM, self._on_alarm)

    # ---- the model and its oracle -----------------------------------------------------------------

    def batch(self, step):
        gen = torch.Generator().manual_seed(self.args.seed * 1_000_003 + step)
        return train_gpt.get_batch(self.train_ids, self.args.batch_size, self.block_size, gen)

    def fresh(self, device):
        torch.manual_seed(self.args.seed)
        model = train_gpt.GPT(train_gpt.GPTConfig(vocab_size=self.vocab_size)).to(device)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)

    def step(self, model, opt, i, device):
        x, y = self.batch(i)
        _, loss = model(x.to(device, non_blocking=True), y.to(device, non_blocking=True))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    def reference(self):
        model, opt = self.fresh("cpu")
        return [self.step(model, opt, i, "cpu") for i in range(self.args.cycle_steps)]

    # ---- snapshots --------------------------------------------------------------------------------

    @staticmethod
    def snapshot(model, opt):
        params = [p.detach().clone() for p in model.parameters()]
        state = {id(p): {k: (v.clone() if torch.is_tensor(v) else v) for k, v in opt.state[p].items()}
                 for p in model.parameters() if p in opt.state}
        return params, state

    @staticmethod
    def restore(model, opt, snap):
        params, state = snap
        with torch.no_grad():
            for p, s in zip(model.parameters(), params):
                p.copy_(s)
                p.grad = None
        for p in model.parameters():
            saved = state.get(id(p))
            if saved is None:
                opt.state.pop(p, None)
                continue
            cur = opt.state[p]
            for k, v in saved.items():
                if torch.is_tensor(v) and torch.is_tensor(cur.get(k)) and cur[k].shape == v.shape:
                    cur[k].copy_(v)
                else:
                    cur[k] = v.clone() if torch.is_tensor(v) else v

    # ---- faults -----------------------------------------------------------------------------------

    def _on_alarm(self, signum, frame):
        if self.armed:
            self.armed = False
            raise TimerInterrupt("soak: timer interrupt")

    def arm_timer(self, seconds):
        self.armed = True
        signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-4))

    def disarm_timer(self):
        self.armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)

    def hook_for(self, fault):
        capacity = torch.vnpu.get_device_properties(self.device).total_memory

        def oom_hook(module, inputs, output):
            torch.empty(capacity + MiB, dtype=torch.uint8, device=self.device)

        def index_hook(module, inputs, output):
            table = torch.zeros(5, 3, device=self.device)
            bad = torch.tensor([1, 7], device=self.device)  # 7 is out of range for 5 rows
            return output + table[bad].sum() * 0

        return {"oom": oom_hook, "index": index_hook}[fault]

    class SyncThread(threading.Thread):
        """Synchronizes, queries and computes (checked against CPU) on its own stream until stopped."""

        def __init__(self, device):
            super().__init__(daemon=True)
            self.device = device
            self.stop = threading.Event()
            self.error = None
            self.iterations = 0

        def run(self):
            try:
                stream = torch.vnpu.Stream(self.device)
                a = torch.arange(64.0).reshape(8, 8) / 64
                expected = a @ a + 1
                while not self.stop.is_set():
                    torch.vnpu.synchronize(self.device)
                    torch.vnpu.current_stream(self.device).query()
                    with torch.vnpu.stream(stream):
                        d = a.to(self.device)
                        e = torch.vnpu.Event()
                        r = d @ d + 1
                        e.record(stream)
                    e.synchronize()
                    if not torch.equal(r.cpu(), expected):
                        raise AssertionError("wrong result on the side stream")
                    torch.vnpu.memory_stats(self.device)
                    self.iterations += 1
            except BaseException as exc:  # reported, not raised: the main thread checks it
                self.error = repr(exc)

    # ---- the loop ---------------------------------------------------------------------------------

    def faulty_step(self, model, opt, i, fault, step_seconds):
        """Runs step i with `fault`; returns True if the fault fired (the step was abandoned)."""
        handle = None
        thread = None
        try:
            if fault in ("oom", "index"):
                blocks = list(model.blocks) if hasattr(model, "blocks") else [m for m in model.modules()]
                handle = self.rng.choice(blocks).register_forward_hook(self.hook_for(fault))
            elif fault == "interrupt":
                self.arm_timer(self.rng.uniform(0.0, step_seconds))
            else:
                thread = self.SyncThread(self.device)
                thread.start()
            try:
                loss = self.step(model, opt, i, self.device)
            finally:
                self.disarm_timer()
                if handle is not None:
                    handle.remove()
                if thread is not None:
                    thread.stop.set()
                    thread.join(timeout=60)
            if thread is not None:
                if thread.is_alive() or thread.error:
                    self.problems.append(f"step {i}: sync thread {'hung' if thread.is_alive() else thread.error}")
                    self.counts["thread"]["lost"] += 1
                    return True
                if thread.iterations == 0:
                    self.problems.append(f"step {i}: sync thread never ran")
            self.check_loss(i, loss)
            return False
        except torch.OutOfMemoryError:
            if fault != "oom":
                raise
            return True
        except TimerInterrupt as exc:
            if fault != "interrupt":
                raise
            site = self.site(exc)
            self.interrupt_sites[site] = self.interrupt_sites.get(site, 0) + 1
            return True
        except (RuntimeError, IndexError) as exc:
            if fault != "index" or "index" not in str(exc).lower():
                raise
            return True

    @staticmethod
    def site(exc):
        """The innermost line of this script (the signal handler aside) running when `exc` was raised."""
        tb, line = exc.__traceback__, "?"
        while tb is not None:
            code = tb.tb_frame.f_code
            if code.co_filename == __file__ and code.co_name != "_on_alarm":
                import linecache
                line = f"{code.co_name}: {linecache.getline(__file__, tb.tb_lineno).strip()}"
            tb = tb.tb_next
        return line

    def step_seconds(self):
        recent = sorted(self.recent[-20:])
        return recent[len(recent) // 2] if recent else 0.2

    def check_loss(self, i, loss):
        ref = self.ref[i]
        rel = abs(loss - ref) / max(abs(ref), 1e-12)
        self.max_rel_diff = max(self.max_rel_diff, rel)
        if loss != ref:
            self.not_bitwise += 1
        if rel > 1e-5:
            raise AssertionError(f"step {i}: loss {loss!r} differs from the CPU's {ref!r} (rel {rel:.2e})")

    def recover_and_check(self, model, opt, i, fault, snap):
        """After a fired fault: nothing pending, snapshot restored, step i again with the CPU's loss, memory back."""
        for attempt in range(3):
            try:
                torch.vnpu.synchronize()  # the work queued before the fault finishes; an error is reported once
                break
            except TimerInterrupt:
                continue  # a late timer signal: try again
            except (RuntimeError, IndexError) as exc:
                if fault == "index" and attempt == 0:
                    continue  # the device-side error surfaced here rather than in the step: reported once
                raise
        torch.vnpu.synchronize()  # must not raise: nothing may stay pending
        self.restore(model, opt, snap)
        self.check_loss(i, self.step(model, opt, i, self.device))

    def memory_checks(self, where):
        ok = True
        alloc = torch.vnpu.memory_allocated()
        if alloc != self.base_allocated:
            self.problems.append(f"{where}: memory_allocated {alloc} != baseline {self.base_allocated}")
            ok = False
        torch.vnpu.empty_cache()
        if not books_match():
            self.problems.append(f"{where}: allocator books do not match the device")
            ok = False
        reserved = torch.vnpu.memory_reserved()
        if reserved != self.base_reserved:
            self.problems.append(f"{where}: memory_reserved {reserved} != baseline {self.base_reserved}")
            ok = False
        rss = rss_bytes()
        self.max_rss_growth = max(self.max_rss_growth, rss - self.base_rss)
        if rss - self.base_rss > self.args.rss_tolerance_mb * MiB:
            self.problems.append(f"{where}: RSS grew by {(rss - self.base_rss) / MiB:.1f} MiB")
            ok = False
        fallbacks = torch.vnpu.get_fallback_ops()
        if fallbacks:
            self.problems.append(f"{where}: fallback ops appeared: {fallbacks}")
            torch.vnpu.reset_op_stats()
            ok = False
        return ok

    def run(self):
        t_ref = time.perf_counter()
        self.ref = self.reference()
        ref_seconds = time.perf_counter() - t_ref
        # Warm-up cycle (no faults): per-op first-call costs, baselines.
        model, opt = self.fresh(self.device)
        t0 = time.perf_counter()
        for i in range(self.args.cycle_steps):
            self.check_loss(i, self.step(model, opt, i, self.device))
        step_seconds = (time.perf_counter() - t0) / self.args.cycle_steps  # first calls included
        self.steps += self.args.cycle_steps
        self.cycles += 1
        torch.vnpu.reset_op_stats()
        self.base_allocated = torch.vnpu.memory_allocated()
        torch.vnpu.empty_cache()
        self.base_reserved = torch.vnpu.memory_reserved()
        self.base_rss = rss_bytes()
        self.max_rss_growth = 0
        if not books_match():
            self.problems.append("baseline: allocator books do not match the device")
        start = time.time()
        deadline = start + 60 * self.args.minutes
        next_report = start + 60
        while time.time() < deadline:
            self.cycles += 1
            # A new cycle continues from the warm model's memory layout: same parameters re-initialised.
            fresh_model, fresh_opt = self.fresh("cpu")
            with torch.no_grad():
                for p, q in zip(model.parameters(), fresh_model.parameters()):
                    p.copy_(q)
            opt.state.clear()
            for i in range(self.args.cycle_steps):
                if time.time() >= deadline:
                    break
                fault = self.rng.choice(FAULTS) if (i > 0 and self.rng.random() < self.args.fault_rate) else None
                if fault is None:
                    t_step = time.perf_counter()
                    self.check_loss(i, self.step(model, opt, i, self.device))
                    self.recent = self.recent[-19:] + [time.perf_counter() - t_step]
                    self.steps += 1
                    continue
                c = self.counts[fault]
                c["injected"] += 1
                snap = self.snapshot(model, opt)
                try:
                    fired = self.faulty_step(model, opt, i, fault, self.step_seconds())
                    if fired:
                        c["fired"] += 1
                        self.recover_and_check(model, opt, i, fault, snap)
                    del snap
                    ok = self.memory_checks(f"cycle {self.cycles} step {i} ({fault})")
                except KeyboardInterrupt as exc:
                    if not isinstance(exc, TimerInterrupt):
                        raise
                    self.problems.append(f"cycle {self.cycles} step {i} ({fault}): a timer interrupt escaped")
                    ok = False
                except Exception as exc:  # a failed recovery: count it, report it, go on from a clean state
                    self.problems.append(f"cycle {self.cycles} step {i} ({fault}): {type(exc).__name__}: {exc}")
                    ok = False
                    self.disarm_timer()
                    try:
                        torch.vnpu.synchronize()
                    except Exception:
                        pass
                    self.restore(model, opt, snap)
                    del snap
                    self.check_loss(i, self.step(model, opt, i, self.device))
                c["recovered" if ok else "lost"] += 1
                self.steps += 1
            if time.time() >= next_report:
                next_report += 60
                done = sum(c["injected"] for c in self.counts.values())
                print(f"[{(time.time() - start) / 60:5.1f} min] {self.steps} steps, {done} faults, "
                      f"{len(self.problems)} problems", flush=True)
        return {"reference_seconds": ref_seconds, "step_seconds": step_seconds, "seconds": time.time() - start}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0, help="how long to run the faulty training (default 30)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cycle-steps", type=int, default=40, help="steps per cycle (the CPU reference's length)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--fault-rate", type=float, default=0.3, help="share of steps that get a fault")
    p.add_argument("--rss-tolerance-mb", type=float, default=64.0)
    p.add_argument("--json", default="out/soak.json")
    args = p.parse_args(argv)

    soak = Soak(args)
    timing = soak.run()
    totals = {k: sum(c[k] for c in soak.counts.values()) for k in ("injected", "fired", "recovered", "lost")}
    result = {
        "minutes": args.minutes, "seed": args.seed, "steps": soak.steps, "cycles": soak.cycles,
        "faults": soak.counts, "totals": totals, "problems": soak.problems,
        "losses": {"not_bitwise_equal_to_cpu": soak.not_bitwise, "max_rel_diff": soak.max_rel_diff},
        "interrupt_sites": soak.interrupt_sites,
        "memory": {"base_allocated": soak.base_allocated, "base_reserved": soak.base_reserved,
                   "base_rss": soak.base_rss, "max_rss_growth": soak.max_rss_growth},
        "timing": timing, "load_average": os.getloadavg(), "machine": platform.machine(),
        "cpus": os.cpu_count(), "torch": torch.__version__,
        "alloc_conf": os.environ.get("PYTORCH_VNPU_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF") or "",
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)

    print(f"\nsoak: {timing['seconds'] / 60:.1f} min, {soak.steps} steps in {soak.cycles} cycles "
          f"({timing['step_seconds'] * 1000:.0f} ms/step), load average {result['load_average'][0]:.1f}")
    print(f"{'fault':<10} {'injected':>9} {'fired':>7} {'recovered':>10} {'lost':>6}")
    for name, c in list(soak.counts.items()) + [("total", totals)]:
        print(f"{name:<10} {c['injected']:>9} {c['fired']:>7} {c['recovered']:>10} {c['lost']:>6}")
    print(f"losses: {soak.not_bitwise} not bitwise equal to CPU, max rel diff {soak.max_rel_diff:.1e}; "
          f"max RSS growth {soak.max_rss_growth / MiB:.1f} MiB")
    for site, n in sorted(soak.interrupt_sites.items(), key=lambda kv: -kv[1]):
        print(f"interrupt landed {n:>4}x in {site}")
    for line in soak.problems[:20]:
        print("problem:", line)
    print(f"wrote {args.json}")
    return 0 if not soak.problems else 1


if __name__ == "__main__":
    sys.exit(main())
