"""Streams and events on vnpu, with torch.cuda's documented semantics: current/default stream, stream
contexts, cross-stream dependencies (wait_stream / wait_event) that do not block the host, event
query/synchronize/elapsed_time, record_stream, priorities, torch.accelerator interop, in-order execution.

Determinism: the gate of torch_vnpu.testing.gate (a CPU custom op that runs on the stream's worker, as every ATen kernel
does on vnpu) holds its stream until the test opens the gate. Work queued behind it is therefore
certainly still pending when the test inspects it, without relying on timing."""
import time

import pytest
import torch

from torch_vnpu.testing.gate import Gate, open_all

v = torch.vnpu


@pytest.fixture(autouse=True)
def _default_streams():
    yield
    open_all()
    for i in range(v.device_count()):
        v.set_stream(v.default_stream(i))


# --------------------------------------------------------------------------- types


def test_stream_and_event_subclass_torch_types():
    assert issubclass(v.Stream, torch.Stream)
    assert issubclass(v.Event, torch.Event)
    s, e = v.Stream(), v.Event()
    assert isinstance(s, torch.Stream) and isinstance(e, torch.Event)
    assert s.device == torch.device("vnpu", 0)
    assert isinstance(v.current_stream(), v.Stream)
    assert isinstance(v.default_stream(), v.Stream)


# --------------------------------------------------------------------------- current / default / set


def test_current_stream_is_default_stream_initially():
    for i in range(v.device_count()):
        d = v.default_stream(i)
        assert d.device_index == i
        assert v.current_stream(i) == d
        assert v.current_stream(f"vnpu:{i}") == d
        assert v.default_stream(torch.device("vnpu", i)) == d
    assert v.current_stream() == v.default_stream(0)


def test_new_streams_are_distinct():
    s1, s2 = v.Stream(), v.Stream()
    assert s1 != v.default_stream() and s2 != v.default_stream() and s1 != s2
    assert s1 == s1 and hash(s1) == hash(s1)


def test_set_stream():
    s = v.Stream()
    v.set_stream(s)
    assert v.current_stream() == s
    assert torch.accelerator.current_stream() == s
    v.set_stream(v.default_stream())
    assert v.current_stream() == v.default_stream()


def test_set_stream_routes_work():
    s = v.Stream()
    x = torch.ones(4, device="vnpu")
    s.wait_stream(v.current_stream())
    with Gate() as g:
        g.block(s)
        v.set_stream(s)
        y = x * 3                      # queued behind the gate on s
        v.set_stream(v.default_stream())
        assert not s.query()
        g.open()
    s.synchronize()
    assert s.query()
    assert torch.equal(y.cpu(), torch.full((4,), 3.0))


def test_stream_context_manager_restores_and_nests():
    s1, s2 = v.Stream(), v.Stream()
    with v.stream(s1):
        assert v.current_stream() == s1
        with v.stream(s2):
            assert v.current_stream() == s2
        assert v.current_stream() == s1
    assert v.current_stream() == v.default_stream()
    with pytest.raises(ValueError):
        with v.stream(s1):
            raise ValueError
    assert v.current_stream() == v.default_stream()
    with v.stream(None):  # no-op, as torch.cuda.stream(None)
        assert v.current_stream() == v.default_stream()
    with s1:  # torch.Stream is itself a context manager
        assert v.current_stream() == s1
    assert v.current_stream() == v.default_stream()


@pytest.mark.skipif(torch.vnpu.device_count() < 2, reason="needs 2 vnpu devices (VNPU_DEVICE_COUNT>=2)")
def test_stream_context_on_other_device_switches_device():
    s1 = v.Stream(device=1)
    assert s1.device_index == 1
    with v.stream(s1):
        assert v.current_device() == 1
        assert v.current_stream() == s1
        t = torch.ones(3, device="vnpu") * 2
    assert v.current_device() == 0
    s1.synchronize()                             # t was produced on s1, not on vnpu:1's current stream
    assert v.current_stream(0) == v.default_stream(0)
    assert v.current_stream(1) == v.default_stream(1)
    assert t.device == torch.device("vnpu", 1)
    assert torch.equal(t.cpu(), torch.full((3,), 2.0))


# --------------------------------------------------------------------------- cross-stream dependencies


def test_wait_stream_orders_consumer_after_producer():
    x = torch.full((1000,), 3.0, device="vnpu")
    s = v.Stream()
    s.wait_stream(v.current_stream())            # x is ready before s uses it
    with Gate() as g:
        g.block(s)
        with v.stream(s):
            y = x * 2                            # queued behind the gate
        v.current_stream().wait_stream(s)        # returns at once: the host is not blocked
        z = y + 1                                # default stream: must wait for y
        assert not s.query()
        g.open()
    assert torch.equal(z.cpu(), torch.full((1000,), 7.0))


def test_wait_event_orders_consumer_after_producer():
    x = torch.arange(1000, dtype=torch.float32, device="vnpu")
    s = v.Stream()
    s.wait_stream(v.current_stream())
    e = v.Event()
    with Gate() as g:
        g.block(s)
        with v.stream(s):
            y = x.sin()
            e.record()                           # on s (the current stream)
        v.current_stream().wait_event(e)
        z = y * 10
        assert not e.query()
        g.open()
    assert torch.equal(z.cpu(), x.cpu().sin() * 10)


def test_event_wait_orders_consumer_after_producer():
    x = torch.full((64,), 2.0, device="vnpu")
    s = v.Stream()
    s.wait_stream(v.current_stream())
    with Gate() as g:
        g.block(s)
        with v.stream(s):
            y = x.pow(3)
        e = v.Event()
        e.record(s)
        e.wait()                                 # the current (default) stream waits
        z = y - 1
        g.open()
    assert torch.equal(z.cpu(), torch.full((64,), 7.0))


def test_stream_wait_stream_with_generic_torch_stream():
    s = torch.Stream(device="vnpu")
    x = torch.ones(16, device="vnpu")
    s.wait_stream(torch.accelerator.current_stream())
    with Gate() as g:
        g.block(s)
        with s:
            y = x + 41
        torch.accelerator.current_stream().wait_stream(s)
        z = y * 1
        g.open()
    assert torch.equal(z.cpu(), torch.full((16,), 42.0))


def test_record_stream_keeps_block_until_side_stream_is_done():
    """CUDA contract: after x.record_stream(s); del x, x's block is not reused by the allocator until
    the work queued on s so far has finished."""
    n = 1 << 16
    x = torch.full((n,), 5.0, device="vnpu")
    v.synchronize()
    s = v.Stream()
    ptr = x.data_ptr()
    with Gate() as g:
        g.block(s)
        with v.stream(s):
            y = x * 2                            # reads x after the gate
        x.record_stream(s)
        del x
        w = torch.empty(n, device="vnpu")        # same size, default stream, while s still needs x
        assert w.data_ptr() != ptr
        w.fill_(-1.0)
        g.open()
    s.synchronize()
    assert torch.equal(y.cpu(), torch.full((n,), 10.0))


def test_record_stream_accepts_generic_and_vnpu_streams():
    x = torch.ones(8, device="vnpu")
    x.record_stream(v.Stream())
    x.record_stream(v.current_stream())
    x.record_stream(torch.Stream(device="vnpu"))
    del x
    v.synchronize()


# --------------------------------------------------------------------------- events


def test_event_query_semantics():
    e = v.Event()
    assert e.query()                             # never recorded: complete (as cudaEventQuery)
    s = v.Stream()
    with Gate() as g:
        g.block(s)
        e.record(s)
        assert not e.query()                     # work before it is pending
        assert not s.query()
        g.open()
        e.synchronize()
    assert e.query()
    v.synchronize()
    assert s.query()


def test_stream_query_true_once_last_recorded_event_completes():
    """cudaStreamQuery: success once all work queued on the stream has completed. The event record
    was the last work on s, so once the event is complete s has nothing pending."""
    s = v.Stream()
    x = torch.ones(256, 256, device="vnpu")
    s.wait_stream(v.current_stream())  # x is written on the default stream (VNPU_SANITIZE found the race)
    failures, n = 0, 100
    for _ in range(n):
        with v.stream(s):
            y = x @ x
            e = v.Event()
            e.record()
        e.synchronize()
        failures += not s.query()
    assert failures == 0, f"stream.query() was False after its last event completed in {failures}/{n} cases"


def test_stream_synchronize_and_query():
    s = v.Stream()
    x = torch.ones(32, device="vnpu")
    s.wait_stream(v.current_stream())
    with Gate() as g:
        g.block(s)
        with v.stream(s):
            y = x * 5
        assert not s.query()
        g.open()
        s.synchronize()
    assert s.query()
    assert torch.equal(y.cpu(), torch.full((32,), 5.0))


def test_event_synchronize_waits_for_captured_work_only():
    s1, s2 = v.Stream(), v.Stream()
    x = torch.ones(8, device="vnpu")
    v.synchronize()
    with Gate() as g:
        g.block(s2)                              # s2 is held; s1 is free
        with v.stream(s1):
            y = x * 4
        e = s1.record_event()
        e.synchronize()                          # must not wait for s2
        assert e.query()
        assert not s2.query()
        g.open()
    assert torch.equal(y.cpu(), torch.full((8,), 4.0))


def test_stream_record_event_returns_event():
    s = v.Stream()
    e = s.record_event()
    assert isinstance(e, torch.Event)
    e.synchronize()
    assert e.query()


def test_stream_record_event_accepts_vnpu_event():
    s = v.Stream()
    e = v.Event()
    r = s.record_event(e)                        # as torch.cuda.Stream.record_event(event)
    assert r is e
    e.synchronize()
    assert e.query()


def _timed_pair(make_event):
    start, end = make_event(), make_event()
    x = torch.ones(8, device="vnpu")
    with Gate() as g:
        start.record()
        g.block()                                # end is recorded after the gate opens ...
        y = x * 2
        end.record()
        time.sleep(0.02)                         # ... which is at least 20 ms later
        g.open()
    v.synchronize()
    return start, end, y


def test_event_elapsed_time_vnpu_events():
    start, end, y = _timed_pair(lambda: v.Event(enable_timing=True))
    ms = start.elapsed_time(end)
    assert isinstance(ms, float) and ms > 0
    assert torch.equal(y.cpu(), torch.full((8,), 2.0))


def test_event_elapsed_time_generic_torch_events():
    start, end, _ = _timed_pair(lambda: torch.Event(device="vnpu", enable_timing=True))
    ms = start.elapsed_time(end)
    assert isinstance(ms, float) and ms > 0


def test_event_elapsed_time_requires_enable_timing():
    start, end = v.Event(), v.Event()
    start.record()
    end.record()
    v.synchronize()
    with pytest.raises((RuntimeError, ValueError)):
        start.elapsed_time(end)


# --------------------------------------------------------------------------- priorities


def test_stream_priority():
    assert v.Stream().priority == 0
    assert v.Stream(priority=0).priority == 0
    assert v.Stream(priority=-1).priority == -1
    # out-of-range priorities map to the nearest valid one (torch.cuda.Stream docs)
    assert v.Stream(priority=-10).priority == -1
    assert v.Stream(priority=5).priority == 0
    assert v.default_stream().priority == 0


def test_high_priority_stream_runs_work():
    s = v.Stream(priority=-1)
    x = torch.arange(10.0, device="vnpu")
    s.wait_stream(v.current_stream())
    with v.stream(s):
        y = x.exp()
    s.synchronize()
    assert torch.equal(y.cpu(), torch.arange(10.0).exp())


# --------------------------------------------------------------------------- torch.accelerator


def test_torch_accelerator_current_stream():
    cs = torch.accelerator.current_stream()
    assert isinstance(cs, torch.Stream)
    assert cs.device == torch.device("vnpu", 0)
    assert cs == v.current_stream()
    s = v.Stream()
    with v.stream(s):
        assert torch.accelerator.current_stream() == s
    torch.accelerator.set_stream(s)
    assert v.current_stream() == s
    torch.accelerator.set_stream(v.default_stream())
    assert torch.accelerator.current_stream() == v.default_stream()
    if v.device_count() > 1:
        assert torch.accelerator.current_stream(1) == v.default_stream(1)
    torch.accelerator.synchronize()


# --------------------------------------------------------------------------- in-order execution


def test_long_inplace_chain_on_side_stream_is_in_order():
    """Non-commuting in-place ops: only in-order execution gives the CPU result (bitwise)."""
    ref = torch.linspace(-1, 1, 257, dtype=torch.float64)
    s = v.Stream()
    x = ref.to("vnpu")
    s.wait_stream(v.current_stream())
    with v.stream(s):
        for i in range(300):
            x.mul_(1.01).add_(i % 7 - 3).div_(1.5)
            ref.mul_(1.01).add_(i % 7 - 3).div_(1.5)
    v.synchronize()
    assert torch.equal(x.cpu(), ref)


def test_in_order_across_many_small_kernels_default_stream():
    x = torch.zeros(4, dtype=torch.int64, device="vnpu")
    for i in range(500):
        x.mul_(3).add_(i).remainder_(1_000_003)
    expected = torch.zeros(4, dtype=torch.int64)
    for i in range(500):
        expected.mul_(3).add_(i).remainder_(1_000_003)
    assert torch.equal(x.cpu(), expected)


def test_external_stream_wraps_a_stream_made_with_the_runtime():
    """torch.vnpu.ExternalStream / get_stream_from_external as torch.cuda's: a vnpuStream_t another library made
    with the runtime (here through its exported vnpuStreamCreate) becomes a torch stream that queues work in
    order; bad handles raise ValueError."""
    import ctypes
    import glob
    import os

    import torch_vnpu

    lib = ctypes.CDLL(glob.glob(os.path.join(os.path.dirname(torch_vnpu.__file__), "lib", "libvnpu_runtime.so*"))[0])
    create = getattr(lib, "_Z16vnpuStreamCreatePP13vnpuStream_st")  # vnpuError_t vnpuStreamCreate(vnpuStream_t*)
    create.restype, create.argtypes = ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p)]
    torch.vnpu.init()
    handle = ctypes.c_void_p()
    assert create(ctypes.byref(handle)) == 0
    s = torch.vnpu.ExternalStream(handle.value)
    assert isinstance(s, torch.vnpu.Stream) and s.vnpu_stream == handle.value and s.device_index == 0
    assert torch.vnpu.get_stream_from_external(handle.value).stream_id == s.stream_id
    x = torch.arange(1000.0, device="vnpu")
    s.wait_stream(torch.vnpu.current_stream())
    with torch.vnpu.stream(s):
        y = (x * 2).cumsum(0)
    s.synchronize()
    assert torch.equal(y.cpu(), (torch.arange(1000.0) * 2).cumsum(0))
    other_device = torch.vnpu.Stream(device=1).vnpu_stream
    for bad, text in ((0, "not a live stream"), (12345, "not a live stream"), (other_device, "belongs to vnpu:1")):
        with pytest.raises(ValueError, match=text):
            torch.vnpu.ExternalStream(bad)
    assert torch.vnpu.ExternalStream(other_device, device=1).device_index == 1
