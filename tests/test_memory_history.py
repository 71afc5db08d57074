"""Memory history and snapshots in CUDA's formats (issue 11, part 2): torch.vnpu.memory._record_memory_history,
_snapshot, _dump_snapshot and _attach_out_of_memory_observer, checked against a known allocation pattern, against
PyTorch's own torch.cuda._memory_viz (which must render the snapshot), and for CUDA's behaviour on bad input.

Recording is process-wide, so every test turns it off again (the `history` fixture)."""
import base64
import gc
import json
import os
import pickle
import re
import subprocess
import sys

import pytest
import torch
from torch.cuda import _memory_viz

MiB = 1 << 20
THIS_FILE = os.path.basename(__file__)


@pytest.fixture
def history():
    """Starts from an empty cache (so that new segments show up as segment_alloc events) and stops recording."""
    gc.collect()  # tensors of earlier tests still in reference cycles (tracebacks) would keep their segments
    torch.vnpu.synchronize()
    torch.vnpu.empty_cache()
    yield torch.vnpu.memory
    torch.vnpu.memory._record_memory_history(enabled=None)


def _handle(stream):
    return stream.vnpu_stream


def _named(frames, name):
    return [f for f in frames if f["name"] == name and f["filename"].endswith(THIS_FILE)]


def _events(snapshot, device=0, addr=None, action=None):
    return [e for e in snapshot["device_traces"][device]
            if (addr is None or e.get("addr") == addr) and (action is None or e["action"] == action)]


def _block_at(snapshot, addr):
    for seg in snapshot["segments"]:
        for b in seg["blocks"]:
            if b["address"] == addr:
                return seg, b
    return None, None


def _known_pattern():
    """3 MiB + 100 bytes on the default stream (freed), 1000 bytes on a side stream (kept), and a matmul whose
    output is kept: returns the pointers, the side stream and the line numbers of the allocations."""
    side = torch.vnpu.Stream()
    line_a = sys._getframe().f_lineno + 1
    a = torch.empty(3 * MiB + 100, dtype=torch.uint8, device="vnpu")
    with torch.vnpu.stream(side):
        line_b = sys._getframe().f_lineno + 1
        b = torch.ones(1000, dtype=torch.uint8, device="vnpu")
    x = torch.randn(64, 64, device="vnpu")
    y = x @ x
    y.sum().item()
    a_ptr = a.data_ptr()
    line_del = sys._getframe().f_lineno + 1
    del a
    return {"a": a_ptr, "b": b, "y": y, "side": side, "line_a": line_a, "line_b": line_b, "line_del": line_del}


def test_known_allocations_appear_in_snapshot_and_trace(history):
    history._record_memory_history(enabled="all", context="all", stacks="python")
    assert torch.vnpu._C._is_history_enabled()
    k = _known_pattern()
    snap = history._snapshot()
    default = _handle(torch.vnpu.default_stream())
    side = _handle(k["side"])
    assert default != side

    assert set(snap) >= {"segments", "device_traces", "allocator_settings"}
    assert len(snap["device_traces"]) == torch.vnpu.device_count()
    # a: alloc, free_requested, free_completed at its address, with the requested size and the default stream.
    a_events = [e for e in _events(snap, addr=k["a"]) if e["action"] in ("alloc", "free_requested", "free_completed")]
    assert [e["action"] for e in a_events] == ["alloc", "free_requested", "free_completed"]
    assert all(e["size"] == 3 * MiB + 100 and e["stream"] == default for e in a_events)
    frames = _named(a_events[0]["frames"], "_known_pattern")
    assert frames and frames[0]["line"] == k["line_a"], a_events[0]["frames"]
    assert _named(a_events[0]["frames"], "test_known_allocations_appear_in_snapshot_and_trace")
    # context="all": the free names the line that dropped the last reference (the `del a`).
    assert _named(a_events[1]["frames"], "_known_pattern")[0]["line"] == k["line_del"]
    assert _named(a_events[2]["frames"], "_known_pattern")[0]["line"] == k["line_del"]
    # a came from a new 20 MiB large segment on the default stream, b from a new 2 MiB small one on the side stream.
    seg_allocs = _events(snap, action="segment_alloc")
    assert any(e["size"] == 20 * MiB and e["stream"] == default and e["addr"] <= k["a"] < e["addr"] + e["size"]
               for e in seg_allocs), seg_allocs
    # b's 2 MiB small segment belongs to the side stream: a new one, or one an earlier user of this pool stream
    # still holds (torch.vnpu.Stream() hands out pool streams round-robin; a live block keeps its segment cached)
    b_ptr = k["b"].data_ptr()
    assert any(s["total_size"] == 2 * MiB and s["stream"] == side and s["address"] <= b_ptr < s["address"] + 2 * MiB
               for s in snap["segments"]), [{k: v for k, v in s.items() if k != "frames"} for s in snap["segments"]]
    (b_alloc,) = _events(snap, addr=b_ptr, action="alloc")
    assert b_alloc["size"] == 1000 and b_alloc["stream"] == side
    assert _named(b_alloc["frames"], "_known_pattern")[0]["line"] == k["line_b"]
    # The matmul's output was allocated too (by the op, on the calling thread: Python frames are there).
    y_ptr = k["y"].data_ptr()
    (y_alloc,) = _events(snap, addr=y_ptr, action="alloc")
    assert y_alloc["size"] == 64 * 64 * 4 and _named(y_alloc["frames"], "_known_pattern")
    # Time stamps are microseconds since the epoch, in order.
    times = [e["time_us"] for e in snap["device_traces"][0]]
    assert times == sorted(times) and abs(times[-1] / 1e6 - __import__("time").time()) < 600
    assert snap["device_traces"][0][-1]["action"] == "snapshot"

    # Segments: b is live, with its stack; a's block is free again.
    seg, blk = _block_at(snap, b_ptr)
    assert blk["state"] == "active_allocated" and blk["size"] == 1024 and blk["requested_size"] == 1000
    assert seg["stream"] == side and seg["segment_type"] == "small" and seg["device"] == 0
    assert _named(blk["frames"], "_known_pattern")[0]["line"] == k["line_b"]
    _, a_blk = _block_at(snap, k["a"])
    assert a_blk["state"] == "inactive" and a_blk["frames"] == []
    for s in snap["segments"]:
        assert s["total_size"] == sum(b["size"] for b in s["blocks"])
        assert s["allocated_size"] == sum(b["size"] for b in s["blocks"] if b["state"] == "active_allocated")
    # memory_snapshot() is the same segments, and the bytes match the allocator's statistics.
    plain = torch.vnpu.memory_snapshot()
    key = lambda s: [(s["device"], s["address"], s["total_size"], s["stream"], b["address"], b["size"], b["state"])
                     for b in s["blocks"]]
    assert [key(s) for s in plain] == [key(s) for s in snap["segments"]]
    for d in range(torch.vnpu.device_count()):
        assert sum(s["total_size"] for s in plain if s["device"] == d) == torch.vnpu.memory_reserved(d)
        assert sum(s["allocated_size"] for s in plain if s["device"] == d) == torch.vnpu.memory_allocated(d)


def test_memory_viz_renders_the_snapshot(history, tmp_path):
    history._record_memory_history(enabled="all", stacks="python")
    k = _known_pattern()
    path = tmp_path / "snapshot.pickle"
    history._dump_snapshot(str(path))
    b_ptr = k["b"].data_ptr()

    # PyTorch's command line renders both plots; the page embeds the snapshot, which holds our allocations.
    for cmd in ("trace_plot", "segment_plot"):
        out = tmp_path / f"{cmd}.html"
        p = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", cmd, str(path), "-o", str(out)],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        html = out.read_text()
        assert "MemoryViz.js" in html
        files = json.loads(re.search(r"const local_files = (\[.*?\])\n", html).group(1))
        embedded = pickle.loads(base64.b64decode(files[0]["base64"]).rstrip(b"\x00") + b"")
        allocs = {(e["addr"], e["size"]) for e in _events(embedded, action="alloc")}
        assert (k["a"], 3 * MiB + 100) in allocs and (b_ptr, 1000) in allocs

    data = pickle.loads(path.read_bytes())
    # The text views read every key they need (segments, blocks, trace entries).
    text = _memory_viz.trace(data)
    assert ":3.0MiB]" in text and ":1000.0B]" in text  # the two allocations, placed in their segments
    assert "= cudaMalloc(" in text and "# free completed for" in text
    summary = _memory_viz.segsum(data)
    assert f"segments: {len(data['segments'])}" in summary
    # The JavaScript viewer's keys: per-segment device/address/total_size/stream/blocks, per-event frames.
    for s in data["segments"]:
        assert {"device", "address", "total_size", "stream", "blocks", "frames", "segment_type"} <= s.keys()
        for b in s["blocks"]:
            assert {"address", "size", "requested_size", "state", "frames"} <= b.keys()
    for e in data["device_traces"][0]:
        assert {"action", "size", "stream", "time_us"} <= e.keys()


def test_state_only_and_context_levels(history):
    # "state": stacks of live blocks, no history (one entry at most, as CUDA).
    history._record_memory_history(enabled="state", context="state", stacks="python")
    t = torch.empty(5000, dtype=torch.uint8, device="vnpu")
    snap = history._snapshot()
    assert [e["action"] for e in snap["device_traces"][0]] == ["snapshot"]
    assert _named(_block_at(snap, t.data_ptr())[1]["frames"], "test_state_only_and_context_levels")
    # context "alloc": stacks in alloc events; a free event carries the allocation's stack (none of its own), as
    # CUDA's; context None: no stacks at all.
    history._record_memory_history(enabled="all", context="alloc", stacks="python", clear_history=True)
    line_u = sys._getframe().f_lineno + 1
    u = torch.empty(5000, dtype=torch.uint8, device="vnpu")
    u_ptr = u.data_ptr()
    del u
    snap = history._snapshot()
    alloc, freed = _events(snap, addr=u_ptr, action="alloc")[0], _events(snap, addr=u_ptr, action="free_requested")[0]
    assert _named(alloc["frames"], "test_state_only_and_context_levels")[0]["line"] == line_u
    assert _named(freed["frames"], "test_state_only_and_context_levels")[0]["line"] == line_u
    history._record_memory_history(enabled="all", context=None, clear_history=True)
    v = torch.empty(5000, dtype=torch.uint8, device="vnpu")
    snap = history._snapshot()
    assert "frames" not in _events(snap, addr=v.data_ptr(), action="alloc")[0]
    assert _block_at(snap, v.data_ptr())[1]["frames"] == []
    # Off: the history is dropped, blocks keep no new stacks.
    history._record_memory_history(enabled=None)
    assert not torch.vnpu._C._is_history_enabled()
    w = torch.empty(5000, dtype=torch.uint8, device="vnpu")
    snap = history._snapshot()
    assert snap["device_traces"][0] == [] and _block_at(snap, w.data_ptr())[1]["frames"] == []


def test_cpp_stacks_and_skip_actions(history):
    history._record_memory_history(enabled="all", stacks="all", skip_actions=["free_requested"])
    t = torch.empty(7000, dtype=torch.uint8, device="vnpu")
    ptr = t.data_ptr()
    del t
    snap = history._snapshot()
    assert _events(snap, addr=ptr, action="free_requested") == []
    (alloc,) = _events(snap, addr=ptr, action="alloc")
    names = [f["name"] for f in alloc["frames"]]
    assert "test_cpp_stacks_and_skip_actions" in names
    # C++ frames (symbolized by torch's unwinder): the Python binding and ATen's factory above the allocator.
    assert any("THPVariable_empty" in n for n in names) and any("empty_generic" in n for n in names), names[:40]


def test_ring_buffer_keeps_the_newest_entries(history):
    history._record_memory_history(enabled="all", context=None, max_entries=5)
    ptrs = []
    for i in range(10):
        t = torch.empty(4096 + 512 * i, dtype=torch.uint8, device="vnpu")
        ptrs.append((t.data_ptr(), 4096 + 512 * i))
    trace = history._snapshot()["device_traces"][0]
    assert len(trace) == 5
    # The newest four events, then the snapshot itself (older ones were overwritten).
    # `t = ...` allocates the new tensor before the old one is freed.
    assert [(e["action"], e.get("addr"), e["size"]) for e in trace[:4]] == [
        ("free_completed",) + ptrs[-3], ("alloc",) + ptrs[-1], ("free_requested",) + ptrs[-2],
        ("free_completed",) + ptrs[-2]]
    assert trace[-1]["action"] == "snapshot"


def test_bad_input_as_cuda(history, tmp_path):
    with pytest.raises(RuntimeError, match="expected state to be 'state', 'all', or None"):
        history._record_memory_history(enabled="everything")
    with pytest.raises(RuntimeError, match="expected context to be 'state', 'alloc', 'all', or None"):
        history._record_memory_history(context="some")
    with pytest.raises(RuntimeError, match="expected stacks to be 'python', or 'all'"):
        history._record_memory_history(stacks="cpp")
    with pytest.raises(RuntimeError, match="Unknown TraceEntry action: allocate"):
        history._record_memory_history(skip_actions=["allocate"])
    with pytest.raises(TypeError):
        history._record_memory_history(max_entries=-1)
    assert not torch.vnpu._C._is_history_enabled()  # nothing half-applied

    # max_entries=0 keeps one entry, as CUDA (no error).
    history._record_memory_history(max_entries=0, stacks="python")
    t = torch.empty(3000, dtype=torch.uint8, device="vnpu")
    assert [e["action"] for e in history._snapshot()["device_traces"][0]] == ["snapshot"]

    # A failed dump raises OSError and loses nothing: the next dump has the same events.
    history._record_memory_history(enabled="all", stacks="python", clear_history=True)
    u = torch.empty(3000, dtype=torch.uint8, device="vnpu")
    with pytest.raises(FileNotFoundError):
        history._dump_snapshot(str(tmp_path / "no" / "such" / "dir" / "s.pickle"))
    os.chmod(tmp_path, 0o500)
    try:
        if os.geteuid() != 0:  # root writes anywhere
            with pytest.raises(PermissionError):
                history._dump_snapshot(str(tmp_path / "s.pickle"))
    finally:
        os.chmod(tmp_path, 0o700)
    history._dump_snapshot(str(tmp_path / "s.pickle"))
    data = pickle.loads((tmp_path / "s.pickle").read_bytes())
    assert _events(data, addr=u.data_ptr(), action="alloc")
    assert [e["action"] for e in data["device_traces"][0]].count("snapshot") >= 2  # the failed dumps' snapshots
    with pytest.raises(TypeError, match="observer must be callable"):
        history._attach_out_of_memory_observer(42)


_OOM_SEEN = []
_OOM_ARMED = []


def _oom_observer(device, alloc, device_allocated, device_free):
    if _OOM_ARMED:
        path = _OOM_ARMED[0]
        torch.vnpu.memory._dump_snapshot(path)  # the documented use: a snapshot at the moment of the OOM
        _OOM_SEEN.append((device, alloc, device_allocated, device_free))


def test_out_of_memory_observer_and_oom_event(history, tmp_path):
    history._attach_out_of_memory_observer(_oom_observer)  # process-wide, as CUDA's; disarmed after the test
    history._record_memory_history(enabled="all", stacks="python")
    total = torch.vnpu.get_device_properties(0).total_memory
    request = 2 * total + 1000
    _OOM_ARMED.append(str(tmp_path / "oom.pickle"))
    try:
        with pytest.raises(torch.OutOfMemoryError, match="vNPU out of memory"):
            torch.empty(request, dtype=torch.uint8, device="vnpu")
    finally:
        _OOM_ARMED.clear()
    assert len(_OOM_SEEN) == 1
    device, alloc, device_allocated, device_free = _OOM_SEEN.pop()
    assert device == 0 and device_allocated == total and alloc >= request and 0 <= device_free <= total
    # The snapshot dumped by the observer, and the one taken now, hold the oom event.
    for snap in (pickle.loads((tmp_path / "oom.pickle").read_bytes()), history._snapshot()):
        (oom,) = _events(snap, action="oom")
        assert oom["size"] == (request + 511) // 512 * 512 and oom["device_free"] == device_free
        assert oom["stream"] == _handle(torch.vnpu.current_stream())
        assert _named(oom["frames"], "test_out_of_memory_observer_and_oom_event")
    assert torch.vnpu.memory_stats()["num_ooms"] >= 1
    t = torch.ones(10, device="vnpu")  # the device is fine afterwards
    assert t.sum().item() == 10


def test_accelerator_memory_functions_answer_for_vnpu():
    gc.collect()  # tensors an earlier test left in a reference cycle would be freed between two queries
    torch.ones(1000, device="vnpu").sum().item()
    keep = torch.empty(3 * MiB, dtype=torch.uint8, device="vnpu")
    acc = torch.accelerator
    assert acc.current_accelerator().type == "vnpu"
    assert acc.memory_allocated() == torch.vnpu.memory_allocated() > 0
    assert acc.memory_reserved() == torch.vnpu.memory_reserved() > 0
    assert acc.max_memory_allocated() == torch.vnpu.max_memory_allocated()
    assert acc.max_memory_reserved() == torch.vnpu.max_memory_reserved()
    assert acc.memory_stats()["allocated_bytes.all.current"] == torch.vnpu.memory_allocated()
    assert acc.get_memory_info() == torch.vnpu.mem_get_info()
    acc.reset_peak_memory_stats()
    assert acc.max_memory_allocated() == torch.vnpu.memory_allocated()
    acc.reset_accumulated_memory_stats()
    assert acc.memory_stats()["allocation.all.allocated"] == 0
    del keep
    acc.empty_cache()
    assert acc.memory_reserved() == torch.vnpu.memory_reserved()
    acc.empty_host_cache()


_CHILD = r"""
import json, pickle, sys, torch
from torch.cuda import _memory_viz
MiB = 1 << 20
r = {}
# Queries answer without initializing the device (as CUDA's: 0 and {} before init).
r["before"] = [torch.accelerator.memory_allocated(), dict(torch.accelerator.memory_stats()),
               torch.vnpu.is_initialized()]
torch.vnpu.memory._record_memory_history(stacks="python")
a = torch.ones(3 * MiB, dtype=torch.uint8, device="vnpu")
b = torch.ones(5 * MiB, dtype=torch.uint8, device="vnpu")
r["a"], r["b"] = a.data_ptr(), b.data_ptr()
del a
torch.vnpu.empty_cache()
snap = torch.vnpu.memory._snapshot()
r["events"] = [(e["action"], e.get("addr"), e["size"]) for e in snap["device_traces"][0]]
r["segments"] = [(s["address"], s["total_size"], s["is_expandable"]) for s in snap["segments"]]
r["reserved"] = torch.vnpu.memory_reserved()
r["stats_text"] = _memory_viz.segsum(snap)
print(json.dumps(r))
"""


def test_expandable_segments_record_page_maps_and_queries_do_not_initialize():
    env = dict(os.environ, PYTORCH_VNPU_ALLOC_CONF="expandable_segments:True", VNPU_MEMORY_PER_DEVICE="64M")
    p = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=120,
                       cwd=os.path.dirname(__file__))
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["before"] == [0, {}, False]
    a, b = r["a"], r["b"]
    ev = [tuple(e) for e in r["events"]]
    # 3 MiB take two 2 MiB pages; 5 MiB more use the free MiB behind a plus two new pages; after a's free,
    # empty_cache unmaps its one whole page (the second one also holds b's start).
    assert ev[:2] == [("segment_map", a, 4 * MiB), ("alloc", a, 3 * MiB)]
    assert ev[2:4] == [("segment_map", a + 4 * MiB, 4 * MiB), ("alloc", b, 5 * MiB)] and b == a + 3 * MiB
    assert ev[4:7] == [("free_requested", a, 3 * MiB), ("free_completed", a, 3 * MiB), ("segment_unmap", a, 2 * MiB)]
    assert ev[7][0] == "snapshot" and len(ev) == 8
    assert r["segments"] == [[a + 2 * MiB, 6 * MiB, True]] and r["reserved"] == 6 * MiB
    assert "segments: 1" in r["stats_text"]
