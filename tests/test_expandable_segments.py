"""Fragmentation (issue 13, item 5): the allocator configuration (PYTORCH_VNPU_ALLOC_CONF, else PYTORCH_ALLOC_CONF,
parsed once like CUDA's) and its options with real semantics: expandable_segments (segments grown page by page
from wherever the device has free memory, through the runtime's vnpuMem* VMM calls), max_split_size_mb,
roundup_power2_divisions, garbage_collection_threshold; without expandable segments, an OOM caused by fragmented
free memory says so and what to do.

The scenario of the issue: an 80 MiB device with 78 MiB free in two pieces (one 2 MiB segment left in the
middle), then a 50 MiB allocation. Settings are read once per process, so each configuration runs in a child
interpreter (all started together by a module fixture)."""
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

MiB = 1 << 20
EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")

# Leaves 78 of 80 MiB free in two pieces: 80 x 1 MiB tensors fill 40 small segments (or pages), all but the one
# in the middle are freed and returned.
_PRELUDE = r"""
import json, warnings, torch
MiB = 1 << 20
v = torch.vnpu
r = {}
def used(d=0):
    free, total = v.mem_get_info(d)
    return total - free
def books_match(d=0):
    segs = [s for s in v.memory_snapshot() if s["device"] == d]
    return sum(s["total_size"] for s in segs) == v.memory_reserved(d) == used(d)
def fragment():
    ts = [torch.empty(MiB, dtype=torch.uint8, device="vnpu") for _ in range(80)]
    keep = ts[40]
    del ts
    v.empty_cache()
    return keep
"""

_FRAGMENTED = _PRELUDE + r"""
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    keep = fragment()
r["warnings"] = [str(w.message) for w in caught]
r["free_before"] = v.mem_get_info(0)[0]
r["expandable"] = any(s["is_expandable"] for s in v.memory_snapshot())
try:
    big = torch.ones(50 * MiB, dtype=torch.uint8, device="vnpu")
    r["big_sum"] = big.sum().item()
    r["books_with_big"] = books_match()
    r["reserved_with_big"] = v.memory_reserved()
    del big
except torch.OutOfMemoryError as e:
    r["oom"] = str(e)
v.empty_cache()
r["books_after"] = books_match()
r["reserved_after"] = v.memory_reserved()
print(json.dumps(r))
"""

_TRAIN = r"""
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import train_gpt
ids, _, vocab = train_gpt.load_corpus()
losses = {}
for device in ("cpu", "vnpu"):
    torch.manual_seed(0)
    model = train_gpt.GPT(train_gpt.GPTConfig(vocab_size=len(vocab))).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(3):
        x, y = train_gpt.get_batch(ids, 8, train_gpt.GPTConfig.block_size, gen)
        _, loss = model(x.to(device), y.to(device))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(loss.item())
    losses[device] = out
segs = torch.vnpu.memory_snapshot()
print(json.dumps({"losses": losses, "expandable": bool(segs) and all(s["is_expandable"] for s in segs)}))
"""

# max_split_size_mb:20: a cached 30 MiB block is not split for a 5 MiB request, and counts as oversize.
# Issue 13, 5b: free memory in many 2 MiB pieces 8 MiB apart (38 x 2 MiB tensors, every 4th kept: 60 of 80 MiB free
# in 6 MiB holes of the stream's address range). Requests larger than any hole must still find pages (a new
# address range); the kept tensors keep their values; at the end every page and address range goes back.
_HOLES = _PRELUDE + r"""
ts = [torch.full((2 * MiB,), i % 251, dtype=torch.uint8, device="vnpu") for i in range(38)]
kept = ts[::4]
del ts
v.empty_cache()
r["free_before"] = v.mem_get_info(0)[0]
r["reserved_before"] = v.memory_reserved()
def fill(n, val):
    t = torch.full((n,), val, dtype=torch.uint8, device="vnpu")
    return t, int(t.sum().item())
r["sums"] = {}
try:
    a, r["sums"]["8"] = fill(8 * MiB, 3)
    b, r["sums"]["40"] = fill(40 * MiB, 5)
    r["books_with_ab"] = books_match()
    del a, b
    v.empty_cache()
    c, r["sums"]["58"] = fill(58 * MiB, 7)   # every free byte but the page the sum's result needs
    r["free_with_c"] = v.mem_get_info(0)[0]
    r["books_with_c"] = books_match()
    try:
        torch.empty(4 * MiB, dtype=torch.uint8, device="vnpu")  # the cached small page goes back: 2 MiB free
    except torch.OutOfMemoryError as e:
        r["oom_full"] = str(e)
    del c
except torch.OutOfMemoryError as e:
    r["oom"] = str(e)
r["kept_intact"] = all(int(t[0].item()) == (4 * i) % 251 and int(t.sum().item()) == 2 * MiB * ((4 * i) % 251)
                       for i, t in enumerate(kept))
# Many rounds of new address ranges: all go back with the pages.
for _ in range(20):
    x = torch.empty(50 * MiB, dtype=torch.uint8, device="vnpu")
    del x
    v.empty_cache()
r["books_after"] = books_match()
r["reserved_after"] = v.memory_reserved()
r["segments_after"] = len(v.memory_snapshot())
print(json.dumps(r))
"""

# Issue 13, 5b: without expandable segments, memory reserved but unallocated (split segments) cannot serve a
# larger request: the OOM says so as CUDA's does. 15 x 4 MiB fill three 20 MiB segments, one tensor per segment
# stays (48 MiB reserved but unallocated), then 30 MiB needs a new segment and 20 MiB is free.
_RESERVED_UNALLOCATED = r"""
import json, torch
MiB = 1 << 20
ts = [torch.empty(4 * MiB, dtype=torch.uint8, device="vnpu") for _ in range(15)]
keep = ts[::5]
del ts
r = {"reserved": torch.vnpu.memory_reserved(), "allocated": torch.vnpu.memory_allocated()}
try:
    torch.empty(30 * MiB, dtype=torch.uint8, device="vnpu")
except torch.OutOfMemoryError as e:
    r["oom"] = str(e)
print(json.dumps(r))
"""

_MAX_SPLIT = r"""
import json, torch
MiB = 1 << 20
v = torch.vnpu
a = torch.empty(30 * MiB, dtype=torch.uint8, device="vnpu")
st = v.memory_stats()
r = {"oversize_alloc": st["oversize_allocations.current"], "oversize_seg": st["oversize_segments.current"],
     "max_split_size": st["max_split_size"]}
del a
b = torch.empty(5 * MiB, dtype=torch.uint8, device="vnpu")
r["segments"] = sorted(s["total_size"] // MiB for s in v.memory_snapshot())
c = torch.empty(25 * MiB, dtype=torch.uint8, device="vnpu")   # an oversize request takes the close fit
r["segments_after_c"] = sorted(s["total_size"] // MiB for s in v.memory_snapshot())
print(json.dumps(r))
"""

# roundup_power2_divisions:4: requests are rounded up to quarter steps between powers of two.
_ROUNDUP = r"""
import json, torch
MiB = 1 << 20
sizes = {}
for n in (int(1.3 * MiB), 5 * MiB + 1, 3 * MiB, 1000):
    before = torch.vnpu.memory_allocated()
    t = torch.empty(n, dtype=torch.uint8, device="vnpu")
    sizes[n] = torch.vnpu.memory_allocated() - before
    del t
print(json.dumps({str(k): v for k, v in sizes.items()}))
"""

# garbage_collection_threshold:0.25 on a 64 MiB device: with 20 MiB cached (> 16 MiB), the next new segment
# first releases the least recently freed cached blocks; no OOM retry is involved.
_GC = r"""
import json, torch
MiB = 1 << 20
v = torch.vnpu
a = torch.empty(20 * MiB, dtype=torch.uint8, device="vnpu")
del a
r = {"cached": v.memory_reserved()}
c = torch.empty(30 * MiB, dtype=torch.uint8, device="vnpu")
r["reserved_after"] = v.memory_reserved()
r["retries"] = v.memory_stats()["num_alloc_retries"]
print(json.dumps(r))
"""

_PLUMBING = r"""
import json, warnings, torch
out = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        x = torch.ones(1000, device="vnpu")
        out["expandable"] = any(s["is_expandable"] for s in torch.vnpu.memory_snapshot())
        out["value"] = x.sum().item()
    except ValueError as e:
        out["error"] = str(e)
out["warnings"] = [str(w.message) for w in caught if "ALLOC_CONF" in str(w.message)]
out["cpu_ok"] = torch.ones(3).sum().item() == 3
print(json.dumps(out))
"""

# The plumbing probe, then (no garbage collection configured) the GC scenario as its baseline.
_PLUMBING_THEN_GC = _PLUMBING.replace("print(json.dumps(out))", "") + _GC.replace(
    "print(json.dumps(r))", 'out["gc"] = r\nprint(json.dumps(out))')

_CHILDREN = {
    # PYTORCH_CUDA_ALLOC_CONF is CUDA's own variable: vnpu does not read it.
    "classic": (_FRAGMENTED, {"VNPU_MEMORY_PER_DEVICE": "80M", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    "expandable": (_FRAGMENTED, {"VNPU_MEMORY_PER_DEVICE": "80M",
                                 "PYTORCH_VNPU_ALLOC_CONF": "expandable_segments:True"}),
    "holes": (_HOLES, {"VNPU_MEMORY_PER_DEVICE": "80M", "PYTORCH_VNPU_ALLOC_CONF": "expandable_segments:True"}),
    "reserved_unallocated": (_RESERVED_UNALLOCATED, {"VNPU_MEMORY_PER_DEVICE": "80M"}),
    "reserved_unallocated_expandable": (_RESERVED_UNALLOCATED, {"VNPU_MEMORY_PER_DEVICE": "80M",
                                                                "PYTORCH_VNPU_ALLOC_CONF": "expandable_segments:True"}),
    "train_expandable": (_TRAIN, {"PYTORCH_VNPU_ALLOC_CONF": "expandable_segments:True"}),
    "max_split": (_MAX_SPLIT, {"PYTORCH_VNPU_ALLOC_CONF": "max_split_size_mb:20,max_non_split_rounding_mb:10"}),
    "roundup": (_ROUNDUP, {"PYTORCH_VNPU_ALLOC_CONF": "roundup_power2_divisions:4"}),
    "gc": (_GC, {"VNPU_MEMORY_PER_DEVICE": "64M", "PYTORCH_VNPU_ALLOC_CONF": "garbage_collection_threshold:0.25"}),
    "generic_variable": (_PLUMBING, {"PYTORCH_ALLOC_CONF": "expandable_segments:True,foo:1"}),
    "vnpu_variable_wins": (_PLUMBING_THEN_GC, {"VNPU_MEMORY_PER_DEVICE": "64M",
                                               "PYTORCH_VNPU_ALLOC_CONF": "expandable_segments:False",
                                               "PYTORCH_ALLOC_CONF": "expandable_segments:True"}),
    "malformed": (_PLUMBING, {"PYTORCH_VNPU_ALLOC_CONF": "expandable_segments:true"}),
}
_CONF_VARS = ("PYTORCH_VNPU_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "VNPU_MEMORY_PER_DEVICE")


@pytest.fixture(scope="module")
def runs():
    procs = {}
    for name, (code, extra) in _CHILDREN.items():
        env = {k: val for k, val in os.environ.items() if k not in _CONF_VARS}
        env.update(extra)
        procs[name] = subprocess.Popen([sys.executable, "-c", code, EXAMPLES], env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, cwd=os.path.dirname(__file__))
    out = {}
    try:
        for name, p in procs.items():
            stdout, stderr = p.communicate(timeout=300)
            assert p.returncode == 0, f"{name} failed:\n{stdout}\n{stderr[-3000:]}"
            out[name] = json.loads(stdout.strip().splitlines()[-1])
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    return out


def test_fragmented_free_memory_oom_says_so_and_what_to_do(runs):
    r = runs["classic"]
    assert r["free_before"] == 78 * MiB and r["expandable"] is False
    msg = r["oom"]
    assert "Tried to allocate 50.00 MiB" in msg and "78.00 MiB is free" in msg
    assert "fragmented" in msg and "PYTORCH_VNPU_ALLOC_CONF=expandable_segments:True" in msg
    assert r["books_after"] is True


def test_expandable_segments_allocate_from_scattered_free_memory(runs):
    r = runs["expandable"]
    assert r["warnings"] == []
    assert r["free_before"] == 78 * MiB and r["expandable"] is True
    assert "oom" not in r, r.get("oom")
    assert r["big_sum"] == 50 * MiB
    assert r["books_with_big"] is True  # reserved == snapshot == the runtime's count, pages mapped
    assert r["reserved_with_big"] == 52 * MiB  # 50 MiB in 2 MiB pages + the page of the kept tensor
    assert r["books_after"] is True and r["reserved_after"] == 2 * MiB  # freed pages went back


def test_expandable_segments_serve_requests_larger_than_every_hole(runs):
    r = runs["holes"]
    assert r["free_before"] == 60 * MiB and r["reserved_before"] == 20 * MiB
    assert "oom" not in r, r.get("oom")
    assert r["sums"] == {"8": 8 * MiB * 3, "40": 40 * MiB * 5, "58": 58 * MiB * 7}
    assert r["books_with_ab"] is True and r["books_with_c"] is True and r["free_with_c"] == 0
    full = r["oom_full"]  # the device is full: an honest OOM, which does not suggest what is already on
    assert "Tried to allocate 4.00 MiB" in full and "2.00 MiB is free" in full and "try setting" not in full
    assert r["kept_intact"] is True
    assert r["books_after"] is True and r["reserved_after"] == 20 * MiB and r["segments_after"] == 10


def test_oom_with_reserved_unallocated_memory_suggests_expandable_segments(runs):
    r = runs["reserved_unallocated"]
    assert r["reserved"] == 60 * MiB and r["allocated"] == 12 * MiB
    msg = r["oom"]
    assert "Tried to allocate 30.00 MiB" in msg and "20.00 MiB is free" in msg
    assert "48.00 MiB is reserved by PyTorch but unallocated" in msg
    assert ("If reserved but unallocated memory is large try setting "
            "PYTORCH_VNPU_ALLOC_CONF=expandable_segments:True to avoid fragmentation") in msg
    # With expandable segments the same program needs no new contiguous range: the pages are there.
    r = runs["reserved_unallocated_expandable"]
    assert "oom" not in r, r.get("oom")
    assert r["allocated"] == 12 * MiB


def test_training_with_expandable_segments_matches_cpu(runs):
    r = runs["train_expandable"]
    assert r["expandable"] is True
    for a, b in zip(r["losses"]["cpu"], r["losses"]["vnpu"]):
        assert abs(a - b) <= 1e-5 * abs(a)


def test_max_split_size_keeps_oversize_blocks_whole(runs):
    r = runs["max_split"]
    assert r["max_split_size"] == 20 * MiB
    assert r["oversize_alloc"] == 1 and r["oversize_seg"] == 1
    assert r["segments"] == [20, 30]  # the 5 MiB request did not split the cached 30 MiB block
    assert r["segments_after_c"] == [20, 30]  # 25 MiB fits the 30 MiB block within max_non_split_rounding


def test_roundup_power2_divisions_rounds_requests(runs):
    r = {int(k): val for k, val in runs["roundup"].items()}
    assert r[int(1.3 * MiB)] == int(1.5 * MiB)  # 1 MiB .. 2 MiB in quarters
    assert r[5 * MiB + 1] == 6 * MiB            # 4 MiB .. 8 MiB in quarters
    assert r[3 * MiB] == 3 * MiB                # already on a step
    assert r[1000] == 1024                      # small sizes: the usual 512-byte rounding


def test_garbage_collection_threshold_releases_cached_blocks_first(runs):
    gc, no_gc = runs["gc"], runs["vnpu_variable_wins"]["gc"]
    assert gc["cached"] == 20 * MiB
    assert no_gc["reserved_after"] == no_gc["cached"] + 30 * MiB   # without it, the cache stays
    assert gc["reserved_after"] == 30 * MiB      # with it, the 20 MiB cached segment went first
    assert gc["retries"] == 0 and no_gc["retries"] == 0


def test_configuration_variables(runs):
    generic = runs["generic_variable"]
    assert generic["expandable"] is True and generic["value"] == 1000
    assert any("PYTORCH_ALLOC_CONF: unknown key 'foo'" in w for w in generic["warnings"]), generic["warnings"]
    assert runs["vnpu_variable_wins"]["expandable"] is False
    assert runs["classic"]["expandable"] is False  # it had PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    bad = runs["malformed"]
    assert "Invalid PYTORCH_VNPU_ALLOC_CONF" in bad["error"] and "True or False" in bad["error"]
    assert bad["cpu_ok"] is True


# In-process: the parser itself (the allocator of this process read its settings long ago).

@pytest.mark.parametrize("text,expected", [
    ("", {"expandable_segments": False, "roundup_power2_divisions": []}),
    (" expandable_segments : True ", {"expandable_segments": True}),
    ("max_split_size_mb:128,max_non_split_rounding_mb:8", {"max_split_size": 128 * MiB,
                                                          "max_non_split_rounding": 8 * MiB}),
    ("roundup_power2_divisions:4", {"roundup_power2_divisions": [4] * 16}),
    ("roundup_power2_divisions:[64:8,256:4,1024:4,>:1]", {"roundup_power2_divisions": [8] * 7 + [4] * 4 + [1] * 5}),
    ("garbage_collection_threshold:0.6,large_segment_size_mb:4", {"garbage_collection_threshold": 0.6,
                                                                  "large_segment_size": 4 * MiB}),
])
def test_parse_accepts_cuda_syntax(text, expected):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parsed = torch.vnpu._C._parse_allocator_config(text)
    for k, val in expected.items():
        assert parsed[k] == val, (k, parsed)


@pytest.mark.parametrize("text,needle", [
    ("foo:1", "unknown key 'foo'"),
    ("bar:[1,2],expandable_segments:True", "unknown key 'bar'"),
    ("release_lock_on_cudamalloc:True", "has no effect on vnpu"),
    ("pinned_use_background_threads:True", "has no effect on vnpu"),
    ("backend:cudaMallocAsync", "native caching allocator"),
])
def test_parse_warns_for_keys_without_effect(text, needle):
    with pytest.warns(UserWarning, match=needle):
        torch.vnpu._C._parse_allocator_config(text)


@pytest.mark.parametrize("text,needle", [
    ("expandable_segments:true", "True or False"),
    ("expandable_segments", "expected ':'"),
    ("max_split_size_mb:10", ">= 20"),
    ("max_split_size_mb:x", "non-negative integer"),
    ("garbage_collection_threshold:1.5", r"\(0.0, 1.0\)"),
    ("roundup_power2_divisions:3", "power of 2"),
    ("roundup_power2_divisions:[64:8", "missing ']'"),
    ("expandable_segments:True:False", "expected ','"),
])
def test_parse_rejects_malformed_values(text, needle):
    with pytest.raises(ValueError, match=needle):
        torch.vnpu._C._parse_allocator_config(text)
