"""torch.profiler sees vnpu work (issue 11, part 1): the Kineto plug-in fed by the runtime's activity records.

The oracle is PyTorch's documented profiler behaviour on CUDA: device activities on one lane per stream, in the
order the streams ran them, each linked to the CPU op that launched it (its "External id"), with an "ac2g" flow
from the launch to the task; key_averages() reports their time as device_time_total of that op; misuse raises
what CPU profiling raises.
"""
import json
import os

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function, schedule, tensorboard_trace_handler

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def _trace(prof, tmp_path, name="trace.json"):
    path = tmp_path / name
    prof.export_chrome_trace(str(path))
    with open(path) as f:
        return json.load(f)["traceEvents"]


def _device_events(events):
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS]


def _known_program():
    """matmul on the default stream, an H2D and a D2H copy, a kernel on a side stream."""
    a = torch.randn(64, 64, device="vnpu")
    b = torch.randn(64, 64, device="vnpu")
    host = torch.arange(1024, dtype=torch.float32)
    side = torch.vnpu.Stream()
    torch.vnpu.synchronize()
    with profile(activities=ACTIVITIES) as prof:
        c = a @ b                               # aten::mm, default stream
        d = host.to("vnpu")                     # Memcpy HtoD, default stream
        side.wait_stream(torch.vnpu.current_stream())  # event record + wait: not device work
        with torch.vnpu.stream(side):
            e = d * 2                           # aten::mul, side stream
        torch.vnpu.current_stream().wait_stream(side)
        back = c.cpu()                          # Memcpy DtoH, default stream
    torch.testing.assert_close(back, a.cpu() @ b.cpu())
    torch.testing.assert_close(e.cpu(), host * 2)
    return prof, side


def test_known_program_device_events_lanes_order_and_correlation(tmp_path):
    prof, side = _known_program()
    events = _trace(prof, tmp_path)
    dev = sorted(_device_events(events), key=lambda e: e["ts"])

    # Exactly these device events, on these lanes (pid = device index, tid = StreamId).
    by_lane = {}
    for e in dev:
        by_lane.setdefault((e["pid"], e["tid"]), []).append(e["name"])
    assert by_lane == {
        (0, 0): ["aten::mm", "Memcpy HtoD (Pageable -> Device)", "Memcpy DtoH (Device -> Pageable)"],
        (0, side.stream_id): ["aten::mul.Tensor"],
    }, by_lane
    # Stream order: tasks of one lane do not overlap and run in submission order; the side-stream kernel
    # ran after the H2D copy it waited for, and before the D2H copy that waited for it.
    for lane in by_lane:
        ev = [e for e in dev if (e["pid"], e["tid"]) == lane]
        for x, y in zip(ev, ev[1:]):
            assert x["ts"] + x["dur"] <= y["ts"] + 1e-3
    times = {e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in dev}
    assert times["Memcpy HtoD (Pageable -> Device)"][1] <= times["aten::mul.Tensor"][0] + 1e-3
    assert times["aten::mul.Tensor"][1] <= times["Memcpy DtoH (Device -> Pageable)"][0] + 1e-3

    # Copies carry their size.
    h2d = next(e for e in dev if e["name"].startswith("Memcpy HtoD"))
    d2h = next(e for e in dev if e["name"].startswith("Memcpy DtoH"))
    assert h2d["args"]["bytes"] == 1024 * 4 and d2h["args"]["bytes"] == 64 * 64 * 4
    assert h2d["cat"] == d2h["cat"] == "gpu_memcpy"

    # Correlation: each device event's External id is that of the CPU op that launched it.
    cpu_ops = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            cpu_ops.setdefault(e["args"]["External id"], e)
    launcher = {e["name"]: cpu_ops[e["args"]["External id"]]["name"] for e in dev}
    assert launcher == {
        "aten::mm": "aten::mm",
        "Memcpy HtoD (Pageable -> Device)": "aten::copy_",
        "aten::mul.Tensor": "aten::mul",
        "Memcpy DtoH (Device -> Pageable)": "aten::copy_",
    }
    for e in dev:  # the launching op began before its task did
        assert cpu_ops[e["args"]["External id"]]["ts"] <= e["ts"] + 1e-3

    # Flow arrows: one "ac2g" flow per device event, from the launch on the host thread to the task.
    starts = {e["id"]: e for e in events if e.get("ph") == "s" and e.get("cat") == "ac2g"}
    ends = {e["id"]: e for e in events if e.get("ph") == "f" and e.get("cat") == "ac2g"}
    assert len(ends) == len(dev) and set(starts) == set(ends)
    for e in dev:
        end = next(f for f in ends.values() if f["pid"] == e["pid"] and f["tid"] == e["tid"] and f["ts"] == e["ts"])
        start = starts[end["id"]]
        assert start["pid"] == os.getpid()
        op = cpu_ops[e["args"]["External id"]]
        assert start["tid"] == op["tid"] and op["ts"] <= start["ts"] + 1e-3 <= op["ts"] + op["dur"] + 2e-3

    # Lane names: the device process and one thread per stream.
    meta = {(e["name"], e["pid"], e.get("tid")): e["args"] for e in events if e.get("ph") == "M"}
    assert meta[("process_name", 0, 0)]["name"] == "vnpu:0"
    assert meta[("thread_name", 0, 0)]["name"] == "stream 0 (default)"
    assert meta[("thread_name", 0, side.stream_id)]["name"] == f"stream {side.stream_id}"


def test_key_averages_device_time_per_op():
    prof, side = _known_program()
    device_events = [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]
    assert sorted(e.name for e in device_events) == sorted(
        ["aten::mm", "aten::mul.Tensor", "Memcpy HtoD (Pageable -> Device)", "Memcpy DtoH (Device -> Pageable)"])
    assert all(e.device_index == 0 for e in device_events)
    assert {e.device_resource_id for e in device_events} == {0, side.stream_id}
    avg = {(e.key, e.device_type): e for e in prof.key_averages()}
    cpu = DeviceType.CPU
    for op in ("aten::mm", "aten::mul", "aten::copy_"):
        assert avg[(op, cpu)].device_time_total > 0, op
        assert avg[(op, cpu)].self_device_time_total > 0, op
    # matmul's time on the device is its mm's (self 0: it launched nothing itself).
    assert avg[("aten::matmul", cpu)].device_time_total == pytest.approx(avg[("aten::mm", cpu)].device_time_total)
    assert avg[("aten::matmul", cpu)].self_device_time_total == 0
    table = prof.key_averages().table(sort_by="device_time_total", row_limit=20)
    assert "Self VNPU" in table and "VNPU total" in table and "aten::mm" in table


def test_record_function_range_and_nothing_recorded_without_device_activity(tmp_path):
    x = torch.randn(32, 32, device="vnpu")
    with profile(activities=ACTIVITIES) as prof:
        with record_function("my_block"):
            y = x.relu()
    events = _trace(prof, tmp_path)
    ranges = [e for e in events if e.get("name") == "my_block" and e.get("cat") == "user_annotation"]
    assert len(ranges) == 1
    relu = next(e for e in _device_events(events) if e["name"].startswith("aten::relu"))
    assert relu["ts"] >= ranges[0]["ts"]
    # CPU-only profiling records no device activity (and the runtime stays off).
    with profile(activities=[ProfilerActivity.CPU]) as cpu_prof:
        y = x.relu()
    torch.vnpu.synchronize()
    assert not _device_events(_trace(cpu_prof, tmp_path, "cpu.json"))
    assert not [e for e in cpu_prof.events() if e.device_type == DeviceType.PrivateUse1]
    del y


def test_schedule_and_tensorboard_trace_handler(tmp_path):
    x = torch.randn(16, 16, device="vnpu")
    traces = tmp_path / "tb"
    with profile(activities=ACTIVITIES, schedule=schedule(wait=1, warmup=1, active=1, repeat=1),
                 on_trace_ready=tensorboard_trace_handler(str(traces))) as prof:
        for step in range(4):
            [x.sin, x.cos, x.exp, x.tanh][step]()  # a different kernel per step
            prof.step()
    files = list(traces.iterdir())
    assert len(files) == 1 and files[0].name.endswith(".pt.trace.json")
    with open(files[0]) as f:
        dev = _device_events(json.load(f)["traceEvents"])
    assert [e["name"] for e in dev] == ["aten::exp"]  # the active step only


def test_compiled_kernels_appear_with_their_generated_names(tmp_path):
    def f(x):
        return (x.sin() + 1) * 2

    cf = torch.compile(f)
    x = torch.randn(1000, device="vnpu")
    cf(x)  # compile outside the profiled region
    torch.vnpu.synchronize()
    with profile(activities=ACTIVITIES) as prof:
        y = cf(x)
    torch.testing.assert_close(y.cpu(), f(x.cpu()))
    names = [e["name"] for e in _device_events(_trace(prof, tmp_path))]
    assert len(names) == 1 and names[0].startswith("cpp_fused_") and "sin" in names[0], names
    avg = {(e.key, e.device_type): e for e in prof.key_averages()}
    assert avg[(names[0], DeviceType.CPU)].device_time_total > 0


def _outcome(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the outcome is compared with CPU profiling's
        return type(e), str(e)
    return None


def _misuse(activities, action, tmp_path):
    """Runs `action` with profilers of `activities`; returns its outcome and the later exports' outcomes."""
    x = torch.ones(4, device="vnpu")
    if action == "start_twice":
        p = profile(activities=activities)
        p.start()
        out = _outcome(p.start)
        x.neg()
        return out, _outcome(p.stop)
    if action == "second_profiler_while_running":
        p1, p2 = profile(activities=activities), profile(activities=activities)
        p1.start()
        out = _outcome(p2.start)
        x.neg()
        return out, _outcome(p2.stop), _outcome(p1.stop)
    if action == "export_before_stop":
        p = profile(activities=activities)
        p.start()
        x.neg()
        out = _outcome(lambda: p.export_chrome_trace(str(tmp_path / "early.json")))
        p.stop()
        return out, _outcome(lambda: p.export_chrome_trace(str(tmp_path / "late.json")))
    if action == "export_to_unwritable_path":
        with profile(activities=activities) as p:
            x.neg()
        out = _outcome(lambda: p.export_chrome_trace(str(tmp_path / "no" / "such" / "dir.json")))
        return out, _outcome(lambda: p.export_chrome_trace(str(tmp_path / "again.json")))
    raise AssertionError(action)


@pytest.mark.parametrize("action", ["start_twice", "second_profiler_while_running", "export_before_stop",
                                    "export_to_unwritable_path"])
def test_misuse_behaves_like_cpu_profiling(action, tmp_path):
    # CUDA's profiler shares this Python and Kineto code: CPU profiling gives its outcomes.
    cpu = _misuse([ProfilerActivity.CPU], action, tmp_path)
    vnpu = _misuse(ACTIVITIES, action, tmp_path)
    assert vnpu == cpu
    if action == "export_before_stop":
        assert cpu[0][0] is AttributeError and cpu[1] is None  # exporting before stop raises; after, works
    if action == "export_to_unwritable_path":
        # Kineto alone logs "Failed to open", raises nothing and drops the trace (a retry raised "Trace is
        # already saved"); torch_vnpu checks the path first: OSError, and the retry exports the trace.
        assert cpu[0][0] is FileNotFoundError and cpu[1] is None, cpu
        assert '"aten::neg"' in (tmp_path / "again.json").read_text()
    # The profiler and the device work afterwards.
    x = torch.ones(4, device="vnpu")
    with profile(activities=ACTIVITIES) as prof:
        y = x.neg()
    assert [e.name for e in prof.events() if e.device_type == DeviceType.PrivateUse1] == ["aten::neg"]
    assert y.cpu().tolist() == [-1.0] * 4


def test_device_error_at_the_profilers_stop_keeps_the_trace(tmp_path):
    # The region ends with a kernel error still queued: leaving it synchronizes and raises the device's error
    # (as CUDA would). torch 2.13 then left the profiler on and lost the trace (crash at exit); the trace of
    # the failing step must be kept, the failed task marked, and the profiler stopped.
    w = torch.randn(10, 4, device="vnpu")
    idx = torch.tensor([50], device="vnpu")  # out of range: the embedding kernel fails on the stream
    with pytest.raises(torch.AcceleratorError):
        with profile(activities=ACTIVITIES) as prof:
            torch.nn.functional.embedding(idx, w)
    assert not torch.autograd.profiler._is_profiler_enabled
    assert not torch._C._autograd._profiler_enabled()
    device = [e.name for e in prof.events() if e.device_type == DeviceType.PrivateUse1]
    assert "aten::index_select" in device, device
    path = tmp_path / "failed_step.json"
    prof.export_chrome_trace(str(path))
    failed = [e for e in json.loads(path.read_text())["traceEvents"]
              if e.get("name") == "aten::index_select" and e.get("cat") == "kernel"]
    assert failed and "error" in failed[0]["args"], failed
    # The device and the profiler work afterwards.
    x = torch.ones(3, device="vnpu")
    with profile(activities=ACTIVITIES) as prof:
        y = x.neg()
    assert [e.name for e in prof.events() if e.device_type == DeviceType.PrivateUse1] == ["aten::neg"]
    assert y.cpu().tolist() == [-1.0] * 3


def _matmul_then_relu(x):
    return (x @ x).relu()


def test_export_stacks_with_device_time(tmp_path):
    # torch 2.13 records Python stacks only with the verbose experimental config (on CPU too); then
    # export_stacks("self_privateuse1_time_total") gives each stack its device time, as
    # "self_cuda_time_total" does on CUDA (flame-graph input).
    x = torch.randn(128, 128, device="vnpu")
    verbose = torch._C._profiler._ExperimentalConfig(verbose=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], with_stack=True,
                 experimental_config=verbose) as p:
        _matmul_then_relu(x)
        torch.vnpu.synchronize()
    path = tmp_path / "stacks.txt"
    p.export_stacks(str(path), "self_privateuse1_time_total")
    lines = path.read_text().splitlines()
    mm = [ln for ln in lines if ln.rsplit(" ", 1)[0].endswith("_matmul_then_relu")]
    assert mm and all(int(ln.rsplit(" ", 1)[1]) > 0 for ln in mm), lines
    mm_op = next(e for e in p.events() if e.name == "aten::mm" and e.device_type == DeviceType.CPU)
    assert int(mm_op.self_device_time_total) in {int(ln.rsplit(" ", 1)[1]) for ln in mm}, (mm, mm_op)


def test_profile_memory_records_vnpu_allocations_and_frees(tmp_path):
    # As CUDA's allocator, vnpu's reports every block it hands out and takes back to the profiler.
    torch.vnpu.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], profile_memory=True) as prof:
        a = torch.empty(1 << 20, device="vnpu")  # 4 MiB
        b = a + 1
        del a, b
        torch.vnpu.synchronize()
    rows = {e.key: e for e in prof.key_averages()}
    assert rows["aten::empty"].self_device_memory_usage == 4 << 20
    assert rows["aten::add"].device_memory_usage == 4 << 20  # its output, allocated by a child op
    path = tmp_path / "mem.json"
    prof.export_chrome_trace(str(path))
    mem = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("name") == "[memory]"]
    vnpu = [e["args"] for e in mem if e["args"].get("Device Type") == int(DeviceType.PrivateUse1)]
    assert [m["Bytes"] for m in vnpu] == [4 << 20, 4 << 20, -(4 << 20), -(4 << 20)]


def test_every_devices_tasks_up_to_stop_appear_one_process_per_device(tmp_path):
    # PyTorch's stop synchronizes the current device only (torch.vnpu.synchronize()); work queued on vnpu:1
    # while vnpu:0 is current is still running then, and must not be lost.
    a0 = torch.randn(16, 16, device="vnpu:0")
    a1 = torch.randn(256, 256, device="vnpu:1")
    side1 = torch.vnpu.Stream(device="vnpu:1")
    torch.vnpu.synchronize(0)
    torch.vnpu.synchronize(1)
    assert torch.vnpu.current_device() == 0
    with profile(activities=ACTIVITIES) as prof:
        b0 = a0.neg()                               # vnpu:0, default stream
        b1 = a1
        for _ in range(6):                          # vnpu:1, default stream: still running at stop
            b1 = b1 @ a1 / 256
        with torch.vnpu.stream(side1):
            c1 = a1.sin()                           # vnpu:1, side stream
    torch.testing.assert_close(b0.cpu(), -a0.cpu())
    expect = a1.cpu()
    for _ in range(6):
        expect = expect @ a1.cpu() / 256
    torch.testing.assert_close(b1.cpu(), expect, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(c1.cpu(), a1.cpu().sin())

    events = _trace(prof, tmp_path)
    by_lane = {}
    for e in sorted(_device_events(events), key=lambda e: e["ts"]):
        by_lane.setdefault((e["pid"], e["tid"]), []).append(e["name"])
    assert by_lane == {
        (0, 0): ["aten::neg"],
        (1, 0): ["aten::mm", "aten::div.Tensor"] * 6,
        (1, side1.stream_id): ["aten::sin"],
    }, by_lane
    meta = {(e["name"], e["pid"], e.get("tid")): e["args"] for e in events if e.get("ph") == "M"}
    assert meta[("process_name", 0, 0)]["name"] == "vnpu:0"
    assert meta[("process_name", 1, 0)]["name"] == "vnpu:1"
    assert meta[("thread_name", 1, 0)]["name"] == "stream 0 (default)"
    assert meta[("thread_name", 1, side1.stream_id)]["name"] == f"stream {side1.stream_id}"
    dev = [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]
    assert sorted({e.device_index for e in dev}) == [0, 1]
    assert sum(e.name == "aten::mm" and e.device_index == 1 for e in dev) == 6


def _copy_events(tmp_path, fn):
    """(cat, name, bytes, pid) of each device event `fn` ran, in time order; the event release tasks of peer
    copies (not device work) left out."""
    torch.vnpu.synchronize(0)
    torch.vnpu.synchronize(1)
    with profile(activities=ACTIVITIES) as prof:
        out = fn()
    dev = sorted(_device_events(_trace(prof, tmp_path)), key=lambda e: e["ts"])
    return out, [(e["cat"], e["name"], e["args"].get("bytes"), e["pid"]) for e in dev if e["name"] != "event release"]


def test_copies_are_named_as_cuda_names_them(tmp_path):
    # CUDA: a copy between tensors of one dtype and dense layout is a memcpy (CUPTI's "Memcpy <kind> (<src> ->
    # <dst>)" with its bytes); one that converts the dtype or gathers a strided tensor on the device is a kernel.
    # vnpu converts host data on the host (during aten::copy_), so a converting host-to-device copy is one memcpy
    # of the converted bytes.
    host = torch.arange(1024, dtype=torch.float32)
    pinned = host.pin_memory()
    x = torch.randn(32, 32, device="vnpu")
    pinned_out = torch.empty(32, 32).pin_memory()
    n = 1024 * 4
    cases = [
        ("H2D pageable", lambda: host.to("vnpu"), host,
         [("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", n, 0)]),
        ("H2D pinned, non_blocking", lambda: pinned.to("vnpu", non_blocking=True), host,
         [("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", n, 0)]),
        ("D2H pageable", lambda: x.cpu(), x.cpu(), [("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", n, 0)]),
        ("D2H pinned, non_blocking", lambda: (pinned_out.copy_(x, non_blocking=True), torch.vnpu.synchronize())[0],
         x.cpu(), [("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", n, 0)]),
        ("D2D clone", lambda: x.clone(), x.cpu(), [("gpu_memcpy", "Memcpy DtoD (Device -> Device)", n, 0)]),
        ("D2D strided", lambda: x.t().contiguous(), x.cpu().t(), [("kernel", "aten::copy_", None, 0)]),
        ("D2D converting", lambda: x.half(), x.cpu().half(), [("kernel", "aten::copy_", None, 0)]),
        ("peer", lambda: x.to("vnpu:1"), x.cpu(), [("gpu_memcpy", "Memcpy PtoP (Device -> Device)", n, 1)]),
        ("peer converting", lambda: x.to("vnpu:1", torch.float16), x.cpu().half(), [("kernel", "aten::copy_", None, 1)]),
        ("H2D converting", lambda: host.to("vnpu", torch.float16), host.half(),
         [("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", n // 2, 0)]),
        ("H2D strided source", lambda: host.view(32, 32).t().to("vnpu"), host.view(32, 32).t(),
         [("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", n, 0)]),
        ("D2H converting", lambda: x.to("cpu", torch.float16), x.cpu().half(),
         [("kernel", "aten::copy_", None, 0), ("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", n // 2, 0)]),
    ]
    for label, fn, expected, events in cases:
        out, got = _copy_events(tmp_path, fn)
        assert got == events, (label, got)
        torch.testing.assert_close(out.cpu(), expected, msg=label)
        if out.device.type == "vnpu":
            assert out.device.index == events[-1][3], label
