"""torch.vnpu as a torch.cuda-like device module: every name libraries probe exists and behaves as
torch.cuda documents it (devices, properties, RNG, memory statistics, amp, torch.accelerator, env vars,
fork safety)."""
import gc
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

GiB = 1024**3
MiB = 1024**2
v = torch.vnpu

_ENV_KEYS = ("VNPU_DEVICE_COUNT", "VNPU_VISIBLE_DEVICES", "VNPU_MEMORY_PER_DEVICE", "VNPU_LAUNCH_BLOCKING")


class _Child:
    """A fresh interpreter running ``code`` with the VNPU_* variables cleared and then set from ``env``;
    the code prints one JSON object as its last line. Children start at once and run concurrently."""

    def __init__(self, code: str, timeout: float = 60, **env_overrides):
        env = {k: val for k, val in os.environ.items() if k not in _ENV_KEYS}
        env.update(env_overrides)
        self.timeout = timeout
        self._result = None
        self.proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def result(self) -> dict:
        if self._result is not None:
            return self._result
        try:
            out, err = self.proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            pytest.fail(f"child timed out after {self.timeout} s:\n{out}\n{err}")
        assert self.proc.returncode == 0, f"child failed (rc={self.proc.returncode}):\n{out}\n{err}"
        self._result = json.loads(out.strip().splitlines()[-1])
        return self._result


def _allocated() -> int:
    return v.memory_allocated()


# --------------------------------------------------------------------------- presence

PROBED_NAMES = [
    "is_available", "is_initialized", "init", "device_count", "current_device", "set_device", "device",
    "device_of", "synchronize", "get_device_name", "get_device_properties", "get_device_capability",
    "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state", "get_rng_state_all",
    "set_rng_state", "set_rng_state_all", "default_generators", "memory_allocated", "max_memory_allocated",
    "memory_reserved", "max_memory_reserved", "memory_stats", "memory_summary", "memory_snapshot",
    "reset_peak_memory_stats", "reset_max_memory_allocated", "reset_accumulated_memory_stats", "empty_cache",
    "mem_get_info", "is_bf16_supported", "get_amp_supported_dtype", "amp", "Stream", "Event", "current_stream",
    "default_stream", "set_stream", "stream", "StreamContext",
]


@pytest.mark.parametrize("name", PROBED_NAMES)
def test_name_exists(name):
    assert hasattr(torch.vnpu, name), f"torch.vnpu.{name} is missing"


def test_public_api_is_documented_and_dir_shows_no_imports():
    """Issue 33 C: every public name has a docstring; dir(torch.vnpu) lists the API, not the modules and typing
    names torch_vnpu.vnpu imports for itself (torch.cuda's public functions all have docstrings too)."""
    names = dir(torch.vnpu)
    assert not set(names) & {"atexit", "operator", "threading", "warnings", "Any", "NamedTuple", "Union", "torch"}
    assert set(torch.vnpu.__all__) <= set(names)
    undocumented = [n for n in torch.vnpu.__all__ if callable(getattr(torch.vnpu, n))
                    and not (getattr(torch.vnpu, n).__doc__ or "").strip()]
    assert undocumented == []


def test_cuda_memory_functions_vnpu_lacked(quiet_allocator):
    x = torch.empty(1 << 20, device="vnpu")
    free, total = v.mem_get_info()
    assert v.device_memory_used() == total - free > 0
    assert v.get_allocator_backend() == "native"  # CUDA's default allocator's name
    lines = v.list_gpu_processes().splitlines()
    assert lines[0] == "GPU:0" and str(os.getpid()) in lines[1] and lines[1].endswith("MB GPU memory")
    for old, new in (("memory_cached", "memory_reserved"), ("max_memory_cached", "max_memory_reserved")):
        with pytest.warns(FutureWarning, match="renamed"):
            assert getattr(v, old)() == getattr(v, new)()
    with pytest.warns(FutureWarning):
        v.reset_max_memory_cached()
    assert v.max_memory_reserved() == v.memory_reserved()
    del x


def test_utilization_is_the_busy_share_of_the_last_second():
    """torch.vnpu.utilization / memory_usage: NVML's utilization.gpu, the share of the last second with a kernel
    running (the runtime's own accounting is checked to the percent with sleeping kernels in
    tests/runtime/utilization_test.cpp)."""
    import time

    x = torch.randn(512, 512, device="vnpu")
    torch.vnpu.synchronize()
    time.sleep(1.05)
    assert v.utilization() == 0 and v.memory_usage() == 0
    start = time.monotonic()
    while time.monotonic() - start < 1.1:  # keep the stream's queue full
        for _ in range(8):
            x = torch.tanh(x @ x * 1e-3)
        torch.vnpu.synchronize()
    busy = v.utilization()
    assert 70 <= busy <= 100, busy
    assert v.utilization(1) == 0  # the other device did nothing
    with pytest.raises((RuntimeError, ValueError, AssertionError)):
        v.utilization(99)


def test_amp_custom_fwd_and_bwd_cast_like_torch_amp():
    seen = {}

    class Scale(torch.autograd.Function):
        @staticmethod
        @v.amp.custom_fwd(cast_inputs=torch.float32)
        def forward(ctx, a, b):
            seen["forward"] = (a.dtype, b.dtype, torch.is_autocast_enabled("vnpu"))
            return a @ b

        @staticmethod
        @v.amp.custom_bwd
        def backward(ctx, g):
            seen["backward_autocast"] = torch.is_autocast_enabled("vnpu")
            return g, g

    a = torch.ones(2, 2, device="vnpu", dtype=torch.bfloat16, requires_grad=True)
    with torch.autocast("vnpu", dtype=torch.bfloat16):
        out = Scale.apply(a, torch.ones(2, 2, device="vnpu"))
    # torch.amp.custom_fwd's contract: inputs cast to float32 and autocast off inside forward
    assert out.dtype == torch.float32 and out.grad_fn is not None
    assert seen["forward"] == (torch.float32, torch.float32, False)
    out.sum().backward()
    assert a.grad is not None and a.grad.dtype == torch.bfloat16
    assert seen["backward_autocast"] is False  # the forward's autocast state (off inside a cast_inputs forward)


def test_module_is_registered_device_module():
    assert torch.get_device_module("vnpu") is torch.vnpu
    assert torch.get_device_module(torch.device("vnpu:0")) is torch.vnpu


# --------------------------------------------------------------------------- availability / init


def test_is_available_and_init():
    assert v.is_available() is True
    v.init()  # idempotent
    v.init()
    assert v.is_initialized() is True


# Code run in fresh interpreters (started together by the `children` fixture, so they overlap).

_ENV_CHILD = """
import json, torch
n = torch.vnpu.device_count()
names = [torch.vnpu.get_device_name(i) for i in range(n)]
last = torch.empty(2, device=f"vnpu:{n - 1}").device.index    # the last visible device works
try:
    torch.vnpu.set_device(n)                                   # one past the end does not
    beyond = "no error"
except RuntimeError:
    beyond = "RuntimeError"
print(json.dumps({"count": n, "acc": torch.accelerator.device_count(), "names": names, "last": last,
                  "beyond": beyond}))
"""

_DEFAULTS_AND_FORK_CHILD = """
import json, os, signal, sys, torch
signal.alarm(60)                                     # a hung process must not outlive the test
# 1. defaults of a fresh process (the VNPU_* variables are unset)
defaults = {"init_after_import": torch.vnpu.is_initialized(), "available": torch.vnpu.is_available(),
            "count": torch.vnpu.device_count()}
defaults["init_after_count"] = torch.vnpu.is_initialized()
torch.vnpu.init()
defaults["init_after_init"] = torch.vnpu.is_initialized()
defaults["total"] = [torch.vnpu.get_device_properties(i).total_memory for i in range(defaults["count"])]
defaults["acc_count"] = torch.accelerator.device_count()
# 2. fork safety
x = torch.ones(4, device="vnpu") + 1                 # the parent uses vnpu ...
torch.vnpu.synchronize()
uses = {
    "tensor_factory": lambda: torch.ones(1, device="vnpu"),
    "to_device": lambda: torch.ones(1).to("vnpu"),
    "op_on_inherited_tensor": lambda: (x + 1).cpu(),
    "synchronize": lambda: torch.vnpu.synchronize(),
    "init": lambda: torch.vnpu.init(),
    "current_device": lambda: torch.vnpu.current_device(),
    "new_stream": lambda: torch.vnpu.Stream(),
}
result = {}
for name, use in uses.items():
    r, w = os.pipe()
    pid = os.fork()                                  # ... then forks
    if pid == 0:
        os.close(r)
        signal.alarm(10)                             # a hung child dies and reports nothing
        try:
            use()
            msg = "no error"
        except RuntimeError as e:
            msg = "RuntimeError: " + str(e)
        except BaseException as e:
            msg = type(e).__name__ + ": " + str(e)
        os.write(w, msg.encode()[:2000])
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        msg = f.read()
    _, status = os.waitpid(pid, 0)
    result[name] = msg if msg else f"child died without reporting (wait status {status})"
print(json.dumps({"defaults": defaults, "fork": result}))
"""

# Discovery and seeding before fork() leave vnpu usable in the child (as CUDA's device_count() and queued
# manual_seed do); calls that initialize (get_device_properties, as on CUDA) make the next child a bad fork.
_FORK_BEFORE_INIT_CHILD = """
import json, os, signal, torch
signal.alarm(60)
r = {}
r["count"] = torch.vnpu.device_count()
r["available"] = torch.vnpu.is_available()
torch.manual_seed(1234)                              # seeds every vnpu device too
torch.vnpu.manual_seed(99)                           # the current device's generator
torch.vnpu.manual_seed_all(99)
torch.vnpu.set_rng_state(torch.vnpu.default_generators[1].get_state(), 1)
r["allocated_before_init"] = torch.vnpu.memory_allocated()   # a query: 0, and no initialization (as CUDA)
r["init_after_discovery_and_seeding"] = torch.vnpu.is_initialized()

def in_child(fn):
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rd)
        signal.alarm(20)
        try:
            out = fn()
        except BaseException as e:
            out = type(e).__name__ + ": " + str(e)
        os.write(wr, json.dumps(out).encode())
        os._exit(0)
    os.close(wr)
    with os.fdopen(rd) as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data) if data else "child died"

def use():
    a = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    d = a.to("vnpu")
    ok = torch.equal((d @ d.t() + 1).cpu(), a @ a.t() + 1)
    return {"ok": ok, "initialized": torch.vnpu.is_initialized(), "seed": torch.vnpu.initial_seed(),
            "bad_fork": torch.vnpu._is_in_bad_fork()}

r["child_after_discovery"] = in_child(use)
r["init_in_parent_after_child"] = torch.vnpu.is_initialized()
x = torch.full((4,), 7.0, device="vnpu")             # the parent initializes after its child did
r["parent_works"] = x.sum().item() == 28.0
r["init_after_tensor"] = torch.vnpu.is_initialized()

print(json.dumps(r))
"""

_PROPERTIES_INIT_CHILD = """
import json, os, signal, torch
signal.alarm(60)
r = {"before": torch.vnpu.is_initialized()}
torch.vnpu.get_device_properties(0)
r["after_properties"] = torch.vnpu.is_initialized()
rd, wr = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        torch.ones(1, device="vnpu")
        msg = "no error"
    except RuntimeError as e:
        msg = "RuntimeError: " + str(e)
    os.write(wr, msg.encode())
    os._exit(0)
os.close(wr)
with os.fdopen(rd) as f:
    r["child"] = f.read()
os.waitpid(pid, 0)
print(json.dumps(r))
"""

_FORK_USES = ["tensor_factory", "to_device", "op_on_inherited_tensor", "synchronize", "init", "current_device",
              "new_stream"]


@pytest.fixture(scope="module")
def children():
    kids = {
        "defaults_and_fork": _Child(_DEFAULTS_AND_FORK_CHILD, timeout=90),
        "fork_before_init": _Child(_FORK_BEFORE_INIT_CHILD, timeout=90),
        "properties_init": _Child(_PROPERTIES_INIT_CHILD, timeout=90),
        "count3": _Child(_ENV_CHILD, VNPU_DEVICE_COUNT="3"),
        "visible1": _Child(_ENV_CHILD, VNPU_VISIBLE_DEVICES="1"),
    }
    yield kids
    for k in kids.values():
        if k.proc.poll() is None:
            k.proc.kill()
            k.proc.communicate()


def test_fresh_process_defaults(children):
    """In a fresh process (no VNPU_* env): 2 devices, 8 GiB each; is_available/device_count do not
    initialize the device (as torch.cuda), init() does."""
    r = children["defaults_and_fork"].result()["defaults"]
    assert r["available"] is True
    assert r["count"] == 2
    assert r["acc_count"] == 2
    assert r["init_after_import"] is False
    assert r["init_after_count"] is False
    assert r["init_after_init"] is True
    assert r["total"] == [8 * GiB, 8 * GiB]


@pytest.mark.parametrize("child,expected", [("count3", 3), ("visible1", 1)],
                         ids=["VNPU_DEVICE_COUNT=3", "VNPU_VISIBLE_DEVICES=1"])
def test_env_controls_device_count(children, child, expected):
    r = children[child].result()
    assert r["count"] == expected
    assert r["acc"] == expected
    assert len(r["names"]) == expected and all(isinstance(n, str) and n for n in r["names"])
    assert r["last"] == expected - 1
    assert r["beyond"] == "RuntimeError"


@pytest.mark.parametrize("use", _FORK_USES)
def test_forked_child_raises(children, use):
    """As CUDA: once the parent has used the device, a fork()ed child that uses it (any torch.vnpu
    call that initializes, or any tensor work) gets RuntimeError("Cannot re-initialize ... in forked
    subprocess ...") instead of hanging."""
    msg = children["defaults_and_fork"].result()["fork"][use]
    assert msg.startswith("RuntimeError:") and "forked subprocess" in msg, msg


def test_discovery_and_seeding_do_not_initialize_and_child_can_use_vnpu(children):
    """device_count(), is_available(), torch.manual_seed(), the vnpu seeding/state setters and memory queries do not
    initialize the device, so a fork()ed child uses vnpu normally and sees the parent's seed; the parent
    initializes afterwards on its own."""
    r = children["fork_before_init"].result()
    assert r["count"] == 2 and r["available"] is True
    assert r["init_after_discovery_and_seeding"] is False
    assert r["allocated_before_init"] == 0
    c = r["child_after_discovery"]
    assert isinstance(c, dict), c
    assert c == {"ok": True, "initialized": True, "seed": 99, "bad_fork": False}
    assert r["init_in_parent_after_child"] is False
    assert r["parent_works"] is True and r["init_after_tensor"] is True


def test_get_device_properties_initializes_and_then_fork_is_refused(children):
    """As on CUDA: get_device_properties initializes, so is_initialized() turns True and a child forked
    afterwards gets the forked-subprocess error."""
    r = children["properties_init"].result()
    assert r["before"] is False and r["after_properties"] is True
    assert r["child"].startswith("RuntimeError:") and "forked subprocess" in r["child"], r["child"]


# --------------------------------------------------------------------------- devices


def test_device_count_and_current_device():
    assert v.device_count() == torch.accelerator.device_count() >= 1
    assert v.current_device() == 0


@pytest.mark.skipif(torch.vnpu.device_count() < 2, reason="needs 2 vnpu devices (VNPU_DEVICE_COUNT>=2)")
def test_set_device_changes_default_device_of_new_tensors():
    v.set_device(1)
    assert v.current_device() == 1
    assert torch.accelerator.current_device_index() == 1
    t = torch.empty(3, device="vnpu")
    assert t.device == torch.device("vnpu", 1)
    v.set_device("vnpu:0")
    assert v.current_device() == 0
    v.set_device(torch.device("vnpu", 1))
    assert v.current_device() == 1
    v.set_device(0)


def test_set_device_out_of_range_raises():
    with pytest.raises(RuntimeError):
        v.set_device(v.device_count())
    assert v.current_device() == 0


@pytest.mark.skipif(torch.vnpu.device_count() < 2, reason="needs 2 vnpu devices (VNPU_DEVICE_COUNT>=2)")
def test_device_context_manager_restores():
    assert v.current_device() == 0
    with v.device(1):
        assert v.current_device() == 1
        assert torch.empty(1, device="vnpu").device.index == 1
        with v.device("vnpu:0"):
            assert v.current_device() == 0
        assert v.current_device() == 1
    assert v.current_device() == 0
    with v.device(torch.device("vnpu:1")):
        assert v.current_device() == 1
    assert v.current_device() == 0
    # restores even when the block raises
    with pytest.raises(ValueError):
        with v.device(1):
            raise ValueError
    assert v.current_device() == 0
    # None and -1 are no-ops, as torch.cuda.device
    with v.device(None):
        assert v.current_device() == 0
    with v.device(-1):
        assert v.current_device() == 0


@pytest.mark.skipif(torch.vnpu.device_count() < 2, reason="needs 2 vnpu devices (VNPU_DEVICE_COUNT>=2)")
def test_device_of():
    t = torch.empty(1, device="vnpu:1")
    with v.device_of(t):
        assert v.current_device() == 1
    assert v.current_device() == 0
    with v.device_of(torch.empty(1)):  # a CPU tensor: no change
        assert v.current_device() == 0


def test_synchronize_variants():
    x = torch.randn(64, 64, device="vnpu")
    y = x @ x
    v.synchronize()
    v.synchronize(0)
    v.synchronize("vnpu:0")
    v.synchronize(torch.device("vnpu", 0))
    torch.accelerator.synchronize()
    assert torch.equal(y.cpu(), x.cpu() @ x.cpu())


def test_device_properties_name_capability():
    for i in range(v.device_count()):
        p = v.get_device_properties(i)
        assert isinstance(p.name, str) and p.name
        assert p.total_memory == 8 * GiB
        assert isinstance(p.multi_processor_count, int) and p.multi_processor_count > 0
        assert isinstance(p.major, int) and isinstance(p.minor, int)
        assert v.get_device_name(i) == p.name
        cap = v.get_device_capability(i)
        assert isinstance(cap, tuple) and cap == (p.major, p.minor)
    assert v.get_device_properties("vnpu:0") == v.get_device_properties(torch.device("vnpu", 0))
    assert v.get_device_properties() == v.get_device_properties(0)
    assert v.get_device_name() == v.get_device_name(0)
    assert isinstance(repr(v.get_device_properties(0)), str)


# --------------------------------------------------------------------------- RNG


def _rand(n=8, device="vnpu"):
    return torch.rand(n, device=device).cpu()


def test_manual_seed_reproduces():
    v.manual_seed(1234)
    a = _rand()
    v.manual_seed(1234)
    b = _rand()
    assert torch.equal(a, b)
    assert v.initial_seed() == 1234
    v.manual_seed(4321)
    assert not torch.equal(_rand(), a)


def test_torch_manual_seed_seeds_vnpu():
    torch.manual_seed(77)
    a = _rand()
    torch.manual_seed(77)
    assert torch.equal(_rand(), a)
    assert all(g.initial_seed() == 77 for g in v.default_generators)


@pytest.mark.skipif(torch.vnpu.device_count() < 2, reason="needs 2 vnpu devices (VNPU_DEVICE_COUNT>=2)")
def test_manual_seed_is_per_device_and_all_seeds_every_device():
    v.manual_seed_all(11)
    assert [g.initial_seed() for g in v.default_generators] == [11] * v.device_count()
    with v.device(1):
        v.manual_seed(5)          # only the current device
        assert v.initial_seed() == 5
    assert v.initial_seed() == 11
    assert v.default_generators[1].initial_seed() == 5
    assert len(v.default_generators) == v.device_count()


def test_seed_and_seed_all_are_nondeterministic_and_recorded():
    v.manual_seed_all(3)
    v.seed()
    s0 = v.initial_seed()
    assert s0 != 3
    v.seed_all()
    seeds = [g.initial_seed() for g in v.default_generators]
    assert len(set(seeds)) == 1 and seeds[0] != 3


def test_rng_state_roundtrip():
    v.manual_seed(99)
    _rand()
    state = v.get_rng_state()
    assert isinstance(state, torch.Tensor) and state.dtype == torch.uint8 and state.device.type == "cpu"
    a = _rand()
    v.set_rng_state(state)
    b = _rand()
    assert torch.equal(a, b)
    # the state is a snapshot: drawing more does not change the saved tensor
    saved = state.clone()
    _rand()
    assert torch.equal(state, saved)
    assert torch.equal(v.get_rng_state(0), v.get_rng_state("vnpu:0"))


def test_rng_state_all_roundtrip():
    v.manual_seed_all(5)
    states = v.get_rng_state_all()
    assert isinstance(states, list) and len(states) == v.device_count()
    draws = []
    for i in range(v.device_count()):
        with v.device(i):
            draws.append(_rand(device=f"vnpu:{i}"))
    v.set_rng_state_all(states)
    for i in range(v.device_count()):
        assert torch.equal(_rand(device=f"vnpu:{i}"), draws[i])


def test_set_rng_state_rejects_wrong_size():
    with pytest.raises(RuntimeError):
        v.set_rng_state(torch.zeros(3, dtype=torch.uint8))


# --------------------------------------------------------------------------- memory


@pytest.fixture
def quiet_allocator():
    # Tensors here die by reference counting. The cyclic GC is off during the test so that garbage
    # from elsewhere (e.g. tracebacks of failed tests) cannot be freed mid-test and shift the counts.
    v.synchronize()
    v.empty_cache()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
    v.synchronize()
    v.empty_cache()


@pytest.mark.parametrize("nbytes,rounded", [(1, 512), (512, 512), (513, 1024), (1000, 1024), (4096, 4096),
                                             (5000, 5120)])
def test_memory_allocated_rises_by_rounded_size_and_falls_after_del(quiet_allocator, nbytes, rounded):
    before = _allocated()
    t = torch.empty(nbytes, dtype=torch.uint8, device="vnpu")
    assert _allocated() - before == rounded
    assert v.memory_stats()["requested_bytes.all.current"] >= nbytes
    del t
    assert _allocated() == before


def test_memory_allocated_per_device_and_default_arg(quiet_allocator):
    before = [v.memory_allocated(i) for i in range(v.device_count())]
    t = torch.empty(1024, dtype=torch.uint8, device=f"vnpu:{v.device_count() - 1}")
    after = [v.memory_allocated(i) for i in range(v.device_count())]
    assert after[-1] - before[-1] == 1024
    assert after[:-1] == before[:-1]
    assert v.memory_allocated() == v.memory_allocated(0) == v.memory_allocated("vnpu:0")
    del t


def test_max_memory_allocated_and_reset(quiet_allocator):
    v.reset_peak_memory_stats()
    base = _allocated()
    assert v.max_memory_allocated() == base
    t = torch.empty(4 * MiB, dtype=torch.uint8, device="vnpu")
    del t
    assert v.max_memory_allocated() >= base + 4 * MiB
    assert _allocated() == base
    v.reset_peak_memory_stats()
    assert v.max_memory_allocated() == base
    t = torch.empty(MiB, dtype=torch.uint8, device="vnpu")
    del t
    assert v.max_memory_allocated() >= base + MiB
    v.reset_max_memory_allocated()
    assert v.max_memory_allocated() == base


def test_memory_reserved_and_peak(quiet_allocator):
    v.reset_peak_memory_stats()
    t = torch.empty(3 * MiB, dtype=torch.uint8, device="vnpu")
    assert v.memory_reserved() >= v.memory_allocated() >= 3 * MiB
    peak = v.max_memory_reserved()
    assert peak >= v.memory_reserved()
    del t
    v.empty_cache()
    assert v.max_memory_reserved() == peak  # the peak survives empty_cache until reset


def test_memory_stats_flat_format(quiet_allocator):
    t = torch.empty(1000, dtype=torch.uint8, device="vnpu")
    s = v.memory_stats()
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak", "allocated_bytes.all.allocated",
                "allocated_bytes.all.freed", "allocated_bytes.large_pool.current",
                "allocated_bytes.small_pool.current", "reserved_bytes.all.current", "active_bytes.all.current",
                "requested_bytes.all.current", "segment.all.current", "allocation.all.current",
                "inactive_split_bytes.all.current", "num_ooms", "num_alloc_retries"):
        assert key in s, key
    assert all(isinstance(val, int) for val in s.values())
    assert not any(isinstance(val, dict) for val in s.values())
    assert s["allocated_bytes.all.current"] == v.memory_allocated()
    assert s["reserved_bytes.all.current"] == v.memory_reserved()
    assert s["allocated_bytes.all.current"] == (s["allocated_bytes.small_pool.current"]
                                                + s["allocated_bytes.large_pool.current"])
    assert s["allocation.all.current"] >= 1
    assert list(s.keys()) == sorted(s.keys())  # torch.cuda.memory_stats returns sorted keys
    del t


def test_memory_summary_is_a_string(quiet_allocator):
    t = torch.empty(1000, dtype=torch.uint8, device="vnpu")
    s = v.memory_summary()
    assert isinstance(s, str) and "\n" in s
    assert "Allocated memory" in s and "Reserved memory" in s
    assert isinstance(v.memory_summary(0, abbreviated=True), str)
    del t


def test_empty_cache_drops_reserved_after_freeing(quiet_allocator):
    reserved0 = v.memory_reserved()
    t = torch.empty(8 * MiB, dtype=torch.uint8, device="vnpu")
    (t.fill_(1)).sum()  # pending work using the block
    del t
    held = v.memory_reserved()
    assert held >= reserved0 + 8 * MiB   # freed blocks stay cached
    v.empty_cache()
    assert v.memory_reserved() <= held - 8 * MiB
    assert v.memory_reserved() == reserved0


def test_mem_get_info(quiet_allocator):
    free, total = v.mem_get_info()
    assert isinstance(free, int) and isinstance(total, int)
    assert 0 <= free <= total
    assert total == v.get_device_properties(0).total_memory
    t = torch.empty(64 * MiB, dtype=torch.uint8, device="vnpu")
    free2, total2 = v.mem_get_info()
    assert total2 == total
    assert free2 <= free - 64 * MiB
    del t
    v.empty_cache()
    assert v.mem_get_info()[0] == free
    assert v.mem_get_info("vnpu:0")[1] == total


# --------------------------------------------------------------------------- amp


def test_bf16_and_amp_dtypes():
    assert v.is_bf16_supported() is True
    dtypes = v.get_amp_supported_dtype()
    assert torch.float16 in dtypes and torch.bfloat16 in dtypes
    assert torch.amp.is_autocast_available("vnpu")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_amp_autocast_casts_matmul(dtype):
    a = torch.randn(8, 8, device="vnpu")
    with v.amp.autocast(dtype=dtype):
        assert torch.is_autocast_enabled("vnpu")
        assert (a @ a).dtype == dtype
    assert not torch.is_autocast_enabled("vnpu")
    with torch.autocast("vnpu", dtype=dtype):
        assert (a @ a).dtype == dtype
    assert (a @ a).dtype == torch.float32


def test_amp_autocast_region_runs_ordinary_ops():
    """Inside autocast, ops outside the cast lists (add, relu, factories) run unchanged, as on CUDA."""
    a = torch.randn(8, 8, device="vnpu")
    with torch.autocast("vnpu", dtype=torch.bfloat16):
        h = torch.relu(a @ a)           # mm -> bf16, relu keeps bf16
        s = a + 1                       # not in any list: stays float32
        z = torch.zeros(2, device="vnpu")
        sm = torch.softmax(h, -1)       # fp32 list: runs in float32
    assert h.dtype == torch.bfloat16
    assert s.dtype == torch.float32 and torch.equal(s.cpu(), a.cpu() + 1)
    assert z.dtype == torch.float32
    assert sm.dtype == torch.float32


def test_amp_autocast_training_step():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to("vnpu")
    x = torch.randn(8, 16, device="vnpu")
    with torch.autocast("vnpu", dtype=torch.bfloat16):
        out = m(x)
        loss = out.float().pow(2).mean()
    assert out.dtype == torch.bfloat16
    loss.backward()
    assert m[0].weight.grad.dtype == torch.float32
    assert torch.isfinite(m[0].weight.grad.cpu()).all()


# --------------------------------------------------------------------------- torch.accelerator


def test_torch_accelerator_reports_vnpu():
    assert torch.accelerator.is_available()
    acc = torch.accelerator.current_accelerator()
    assert isinstance(acc, torch.device) and acc.type == "vnpu"
    assert torch.accelerator.device_count() == v.device_count()
    assert torch.accelerator.current_device_index() == v.current_device()
    if v.device_count() > 1:
        torch.accelerator.set_device_index(1)
        try:
            assert v.current_device() == 1
        finally:
            torch.accelerator.set_device_index(0)
    assert v.current_device() == 0


def test_peer_access_and_tf32_answers():
    n = torch.vnpu.device_count()
    assert torch.vnpu.can_device_access_peer(0, 0) is False  # CUDA's answer for a device and itself
    if n > 1:
        assert torch.vnpu.can_device_access_peer(0, 1) and torch.vnpu.can_device_access_peer("vnpu:1", "vnpu:0")
        a = torch.arange(6.0, device="vnpu:0")
        assert torch.equal(a.to("vnpu:1").cpu(), torch.arange(6.0))  # the access it promises
    with pytest.raises(AssertionError, match="Invalid peer device id"):
        torch.vnpu.can_device_access_peer(0, n)
    with pytest.raises(AssertionError, match="Invalid device id"):
        torch.vnpu.can_device_access_peer(n, 0)
    with pytest.raises(ValueError):
        torch.vnpu.can_device_access_peer(0, None)  # the peer must be named, as torch.cuda
    assert torch.vnpu.is_tf32_supported() is False
