"""vccl under faults and special modes, each in a fresh world of processes: a peer that dies or never
joins (a clear error within the timeout, never a hang; other groups keep working),
monitored_barrier naming the missing rank, TORCH_DISTRIBUTED_DEBUG=DETAIL, VNPU_LAUNCH_BLOCKING=1,
and init_device_mesh before init_process_group."""

import datetime
import os
import threading
import time

import pytest
import torch
import torch.distributed as dist

from torch_vnpu.testing.distributed import ProcessWorld, run_world


def _dead_peer(rank, ws):
    dist.barrier()
    if rank == 1:
        threading.Timer(0.5, lambda: os._exit(0)).start()  # dies after reporting back
        return None
    time.sleep(2.0)
    t0 = time.perf_counter()
    try:
        x = torch.ones(4, device="vnpu")
        dist.all_reduce(x)
        torch.vnpu.synchronize()
        return ("no error", time.perf_counter() - t0)
    except RuntimeError as e:
        return (str(e).splitlines()[0], time.perf_counter() - t0)


def test_a_dead_peer_gives_an_error_not_a_hang():
    res = run_world(2, _dead_peer, init_kwargs={"timeout": datetime.timedelta(seconds=20)})
    msg, elapsed = res[0]
    assert "vccl: all_reduce" in msg and ("Gloo" in msg or "failed" in msg), msg
    assert elapsed < 20, elapsed


def _absent_peer(rank, ws):
    out = {}
    g = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=3))
    if rank == 0:
        t0 = time.perf_counter()
        x = torch.ones(4, device="vnpu")
        try:
            dist.all_reduce(x, group=g)
            torch.vnpu.synchronize()
            out["error"] = None
        except RuntimeError as e:
            out["error"] = str(e).splitlines()[0]
        out["elapsed"] = time.perf_counter() - t0
        # the group is unusable now: later ops fail at once with the first failure's cause
        t0 = time.perf_counter()
        try:
            dist.all_reduce(x, group=g)
            out["second"] = None
        except RuntimeError as e:
            out["second"] = str(e).splitlines()[0]
        out["second_elapsed"] = time.perf_counter() - t0
    dist.barrier()  # the world group is unaffected
    # a new group works
    g2 = dist.new_group([0, 1])
    y = torch.full((3,), float(rank + 1), device="vnpu")
    dist.all_reduce(y, group=g2)
    out["new_group"] = y.cpu().tolist()
    return out


@pytest.fixture(scope="module")
def subgroup_world():
    """A world whose default group these tests keep healthy (their faults hit subgroups only)."""
    with ProcessWorld(2) as w:
        yield w


def test_a_peer_that_never_joins_times_out_and_other_groups_keep_working(subgroup_world):
    res = subgroup_world.run(_absent_peer)
    r0 = res[0]
    assert r0["error"] is not None and "vccl: all_reduce" in r0["error"], r0
    assert "Timed out" in r0["error"] or "timed out" in r0["error"], r0
    assert 2.5 < r0["elapsed"] < 15, r0
    assert "failed earlier" in r0["second"] and r0["second_elapsed"] < 1, r0
    assert res[0]["new_group"] == res[1]["new_group"] == [3.0, 3.0, 3.0]


def _subgroup_peer_absent(rank, ws):
    g = dist.new_group([1, 2], timeout=datetime.timedelta(seconds=2))
    out = None
    if rank == 1:  # global rank 2 (group rank 1) never calls
        out = []
        for _ in range(2):  # the failure, then "failed earlier"
            try:
                dist.all_reduce(torch.ones(4, device="vnpu"), group=g)
                torch.vnpu.synchronize()
            except RuntimeError as e:
                out.append(str(e))
    dist.barrier()
    return out


def _peer_dies(rank):
    """Rank 1 exits 0.5 s after the barrier (True there); rank 0 goes on 2 s later, its peer gone."""
    dist.barrier()
    if rank == 1:
        threading.Timer(0.5, lambda: os._exit(0)).start()
        return True
    time.sleep(2.0)
    return False


def _dead_peer_result_copied_to_another_device(rank, ws):
    """The result of a collective whose peer died, copied to another device and read there: the copy fails on that
    device (Note [Errors follow peer copies]) instead of handing it the un-reduced values."""
    if _peer_dies(rank):
        return None
    x = torch.ones(4, device="vnpu:0")
    dist.all_reduce(x, async_op=True).wait()
    try:
        got = ("no error", x.to("vnpu:1").cpu().tolist())
    except RuntimeError as e:
        got = (type(e).__name__, str(e))
    try:  # a converting copy (a kernel, not a memcpy)
        converted = ("no error", x.to("vnpu:1", torch.float64).cpu().tolist())
    except RuntimeError as e:
        converted = (type(e).__name__, str(e))
    try:
        torch.vnpu.synchronize(0)
        own = None
    except RuntimeError as e:
        own = str(e)
    return got, converted, own


def test_a_failed_collectives_result_copied_to_another_device_raises_there():
    got, converted, own = run_world(2, _dead_peer_result_copied_to_another_device,
                                    init_kwargs={"timeout": datetime.timedelta(seconds=5)})[0]
    for kind, msg in (got, converted):
        assert kind != "no error", f"the un-reduced tensor was returned: {msg}"
        assert "vnpu:0" in msg and "vccl: all_reduce" in msg, msg
    assert own is not None and "vccl: all_reduce" in own, own  # the collective's device reports it too


def _many_absent_peers(rank, ws, n):
    """Synchronous all_reduces whose peer never calls, each read at once while two threads load the CPU: the read
    must raise every time. (The hold stream's gate could claim the report and the caller's gate then return
    before the error was posted: the read returned the un-reduced value about once in 60.)"""
    groups = [dist.new_group([0, 1], timeout=datetime.timedelta(seconds=0.2)) for _ in range(n)]
    for g in groups:
        w = torch.ones(2, device="vnpu")
        dist.all_reduce(w, group=g)
        assert w.cpu().tolist() == [2.0, 2.0]
    dist.barrier()
    if rank == 1:
        time.sleep(n * 0.25 + 2)
        dist.barrier()
        return None
    stop = threading.Event()

    def burn():
        a = torch.randn(300, 300)
        while not stop.is_set():
            a = torch.tanh(a @ a)

    threads = [threading.Thread(target=burn, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    silent = []
    for i, g in enumerate(groups):
        y = torch.ones(2, device="vnpu")
        try:
            dist.all_reduce(y, group=g)
            silent.append((i, y.cpu().tolist()))
        except RuntimeError:
            pass
    stop.set()
    try:
        torch.vnpu.synchronize()
        late = None
    except RuntimeError as e:
        late = str(e)
    dist.barrier()
    return silent, late


def test_every_read_after_a_failed_collective_raises(subgroup_world):
    silent, late = subgroup_world.run(_many_absent_peers, 40, timeout=120)[0]
    assert silent == [] and late is None, (silent, late)


def test_a_subgroups_error_maps_its_ranks_to_global_ranks():
    """Errors name group ranks (as the transport sees them); in a subgroup the message says which global ranks
    those are, so "rank 1" is not mistaken for global rank 1."""
    msgs = run_world(3, _subgroup_peer_absent)[1]
    assert len(msgs) == 2 and "failed earlier" in msgs[1], msgs
    for msg in msgs:
        assert "vccl: all_reduce" in msg and "whose global ranks are [1, 2]" in msg, msg


def _late_rank(rank, ws):
    g = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=3))
    x = torch.full((4,), float(rank + 1), device="vnpu")
    if rank == 1:
        time.sleep(5.0)  # arrives after rank 0 gave up
    try:
        dist.all_reduce(x, group=g)
        torch.vnpu.synchronize()
        out = ("no error", x.cpu().tolist())
    except RuntimeError as e:
        out = ("error", str(e).splitlines()[0])
    dist.barrier()  # the world group is unaffected
    return out


def test_a_rank_arriving_after_its_peer_timed_out_gets_an_error_not_a_partial_result(subgroup_world):
    """Rank 0 times out waiting for rank 1 and leaves; rank 1 arrives later. On shared memory it used to see rank
    0's inputs posted, do its own share, and return [2, 2, 2, 2] (its value only) with no error."""
    res = subgroup_world.run(_late_rank)
    assert res[0][0] == "error" and "timed out" in res[0][1].lower(), res
    assert res[1][0] == "error", res
    assert "vccl: all_reduce" in res[1][1], res


def _monitored(rank, ws):
    res = {}
    for name, backend in (("cpu_gloo", None), ("vccl_only", "vccl")):
        g = dist.new_group([0, 1], backend=backend)
        dist.monitored_barrier(g, timeout=datetime.timedelta(seconds=10))  # both arrive: passes
        if rank == 0:
            try:
                dist.monitored_barrier(g, timeout=datetime.timedelta(seconds=2))
                res[name] = None
            except RuntimeError as e:
                res[name] = str(e)
        dist.barrier()
    return res


def test_monitored_barrier_names_the_missing_rank(subgroup_world):
    res = subgroup_world.run(_monitored)
    for name in ("cpu_gloo", "vccl_only"):
        assert res[0][name] is not None and "Rank 1" in res[0][name], (name, res[0][name])


def _detail(rank, ws):
    g = dist.group.WORLD._get_backend(torch.device("vnpu"))
    wrapped = type(g).__name__
    try:
        dist.all_reduce(torch.ones(2 + rank, device="vnpu"))
        return wrapped, None
    except RuntimeError as e:
        return wrapped, str(e)


def test_torch_distributed_debug_detail_wraps_vccl_and_raises_at_the_call():
    res = run_world(2, _detail, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    for wrapped, err in res:
        assert wrapped == "_ProcessGroupWrapper"
        assert err is not None and "mismatch" in err.lower(), err


def _launch_blocking(rank, ws):
    out = {}
    x = torch.ones(8, device="vnpu")
    w = dist.all_reduce(x, async_op=True)
    out["completed_at_return"] = w.is_completed()
    # p2p must still overlap: send-before-recv on both ranks
    a = torch.full((1 << 16,), float(rank), device="vnpu")
    b = torch.empty(1 << 16, device="vnpu")
    s = dist.isend(a, 1 - rank)
    r = dist.irecv(b, 1 - rank)
    s.wait()
    r.wait()
    out["p2p"] = b[:2].cpu().tolist()
    try:
        dist.all_reduce(torch.ones(3 + rank, device="vnpu"))
        out["mismatch"] = None
    except RuntimeError as e:
        out["mismatch"] = type(e).__name__
    return out


def test_launch_blocking_completes_collectives_in_the_call():
    res = run_world(2, _launch_blocking, env={"VNPU_LAUNCH_BLOCKING": "1"})
    for rank, r in enumerate(res):
        assert r["completed_at_return"] is True
        assert r["p2p"] == [float(1 - rank)] * 2
        assert r["mismatch"] == "DistBackendError"


def _mesh_without_init(rank, ws):
    from torch.distributed.device_mesh import init_device_mesh

    assert not dist.is_initialized()
    mesh = init_device_mesh("vnpu", (ws,))
    x = torch.full((2,), float(rank), device="vnpu")
    dist.all_reduce(x, group=mesh.get_group())
    return dist.get_backend_config(), torch.vnpu.current_device(), x.cpu().tolist()


def test_init_device_mesh_before_init_process_group():
    res = run_world(2, _mesh_without_init, init=False)
    for rank, (config, device, x) in enumerate(res):
        assert config == "cpu:gloo,vnpu:vccl"
        assert device == rank  # set from LOCAL_RANK by DeviceMesh
        assert x == [1.0, 1.0]


def _transport(rank, ws):
    x = torch.full((4,), float(rank + 1), device="vnpu")
    dist.all_reduce(x)
    return dist.group.WORLD._get_backend(torch.device("vnpu")).transport, x.cpu().tolist()


def test_private_device_memory_falls_back_to_gloo():
    # VNPU_IPC=0: device memory is not shareable, so the ranks agree on Gloo (and still compute right)
    for transport, x in run_world(2, _transport, env={"VNPU_IPC": "0"}):
        assert transport == "gloo" and x == [3.0] * 4


# ---------------------------------------------------------------- 4 ranks

def _four(rank, ws):
    fails = []
    R = dist.ReduceOp
    g = torch.Generator().manual_seed(42)
    xs = [torch.randn(8, 3, generator=g) for _ in range(ws)]
    for dtype in (torch.float32, torch.bfloat16):
        t = xs[rank].to(dtype).to("vnpu")
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
        exp = sum(x.to(dtype).double() * 0.5 for x in xs)
        torch.testing.assert_close(t.cpu().double(), exp, rtol=2e-2 if dtype == torch.bfloat16 else 1e-5,
                                   atol=2e-2 if dtype == torch.bfloat16 else 1e-5)
    out = torch.empty(2, 3, device="vnpu")
    dist.reduce_scatter_tensor(out, xs[rank].to("vnpu"), op=R.AVG)
    torch.testing.assert_close(out.cpu(), (sum(xs) / ws).chunk(ws)[rank])
    # uneven all_to_all_single: rank s sends s + d + 1 rows to rank d
    sizes = [[s + d + 1 for d in range(ws)] for s in range(ws)]
    ins = [torch.arange(sum(sizes[s]), dtype=torch.float32) + 100 * s for s in range(ws)]
    out_splits = [sizes[s][rank] for s in range(ws)]
    o = torch.empty(sum(out_splits), device="vnpu")
    dist.all_to_all_single(o, ins[rank].to("vnpu"), out_splits, sizes[rank])
    torch.testing.assert_close(o.cpu(), torch.cat([ins[s].split(sizes[s])[rank] for s in range(ws)]))
    # subgroups: new_group and split_group
    evens, odds = dist.new_group([0, 2]), dist.new_group([1, 3])
    mine = evens if rank % 2 == 0 else odds
    y = torch.full((2,), float(rank), device="vnpu")
    dist.all_reduce(y, group=mine)
    if y.tolist() != [float(2 + 2 * (rank % 2))] * 2:
        fails.append(f"new_group {y.tolist()}")
    sub = dist.split_group(split_ranks=[[0, 1], [2, 3]])
    z = torch.full((2,), float(rank), device="vnpu")
    dist.all_reduce(z, group=sub)
    if z.tolist() != [float(1 + 4 * (rank // 2))] * 2:
        fails.append(f"split_group {z.tolist()}")
    if type(sub._get_backend(torch.device("vnpu"))).__name__ != "ProcessGroupVCCL":
        fails.append("split_group backend")
    # a 2-D device mesh, collectives along each dimension
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("vnpu", (2, 2), mesh_dim_names=("dp", "tp"))
    for dim, expect in (("dp", rank % 2 * 2 + 2), ("tp", (rank // 2) * 4 + 1)):
        v = torch.full((1,), float(rank), device="vnpu")
        dist.all_reduce(v, group=mesh.get_group(dim))
        if v.item() != float(expect):
            fails.append(f"mesh {dim}: {v.item()} != {expect}")
    return fails


def test_four_ranks_subgroups_and_mesh(world4):
    for fails in world4.run(_four):
        assert fails == []


def _check_flag(rank, ws):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = dist.new_group([0, 1])
        x = torch.full((2,), float(rank + 1), device="vnpu")
        dist.all_reduce(x, group=g)  # (the group's vccl backend is made at its first use)
    return [str(w.message) for w in caught if "VNPU_VCCL_CHECK" in str(w.message)], x.cpu().tolist()


def test_vccl_check_follows_the_boolean_rule():
    """VNPU_VCCL_CHECK=false is not understood (only 1/0, PyTorch's rule): a warning naming it, checks stay on."""
    res = run_world(2, _check_flag, env={"VNPU_VCCL_CHECK": "false"})
    for msgs, vals in res:
        assert msgs and "Ignoring invalid value for boolean flag VNPU_VCCL_CHECK: 'false'" in msgs[0], msgs
        assert vals == [3.0, 3.0]


# ---------------------------------------------------------------- futures and waits see the failure

def _absent_peer_waits(rank, ws):
    """Rank 1 never calls; rank 0 waits on each collective in one of the ways real code does and reads the
    result. Every one must raise within a bound; none may hand back the un-reduced input."""
    out = {}
    names = ("future.wait", "then", "wait(timeout)", "ddp")
    # every rank creates every group first (a group's creation waits for all its ranks)
    groups = {n: dist.new_group([0, 1], timeout=datetime.timedelta(seconds=2)) for n in names}

    def attempt(name, fn):
        g = groups[name]
        if rank != 0:
            return
        x = torch.ones(4, device="vnpu")
        t0 = time.perf_counter()
        try:
            value = fn(x, g)
            out[name] = ("no error", value, time.perf_counter() - t0)
        except RuntimeError as e:
            out[name] = (type(e).__name__, str(e).splitlines()[0], time.perf_counter() - t0)
        # each failure is reported once: the next synchronization is clean
        try:
            torch.vnpu.synchronize()
            out[name + " then synchronize"] = None
        except RuntimeError as e:
            out[name + " then synchronize"] = str(e)

    def fut_wait(x, g):
        return dist.all_reduce(x, group=g, async_op=True).get_future().wait()[0].cpu().tolist()

    seen = []

    def then_cb(x, g):
        def cb(f):
            # NCCL's futures complete at issue: the callback runs at then(), on the calling thread
            seen.append(threading.get_ident() == threading.main_thread().ident)
            return f.value()[0] * 2
        return dist.all_reduce(x, group=g, async_op=True).get_future().then(cb).wait().cpu().tolist()

    def wait_timeout(x, g):
        w = dist.all_reduce(x, group=g, async_op=True)
        w.wait(timeout=datetime.timedelta(milliseconds=500))
        return x.cpu().tolist()

    def ddp_backward(x, g):
        from torch.nn.parallel import DistributedDataParallel as DDP
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 2).to("vnpu")
        # DDP's construction broadcasts over the group: skip it (the peer never comes), as a rank whose peer
        # died after construction would see it.
        ddp = DDP(m, process_group=g, init_sync=False) if "init_sync" in DDP.__init__.__code__.co_varnames \
            else None
        if ddp is None:
            raise RuntimeError("skip: DDP has no init_sync")
        ddp(x.unsqueeze(0)).sum().backward()
        torch.vnpu.synchronize()
        return m.weight.grad.cpu().tolist()

    for name, fn in zip(names, (fut_wait, then_cb, wait_timeout, ddp_backward)):
        attempt(name, fn)
    out["then_callback_saw"] = seen
    dist.barrier()  # the world group is unaffected
    return out


def test_futures_and_timed_waits_raise_when_a_peer_never_calls(subgroup_world):
    """A collective whose peer never calls: reading the result of get_future().wait() (what DDP's reducer does
    per bucket), of a then() callback, after wait(timeout), or DDP's gradients raises within the group's
    timeout; the un-reduced input is never returned as the result. Futures complete at issue, as NCCL's: the
    failure surfaces at the synchronization that reads the result (the vNPU's asynchronous error, an
    AcceleratorError naming the collective), once."""
    r0 = subgroup_world.run(_absent_peer_waits)[0]
    for name in ("future.wait", "then", "ddp"):
        kind, msg, elapsed = r0[name]
        assert kind in ("AcceleratorError", "DistBackendError"), (name, r0[name])
        assert "vccl: all_reduce" in msg and ("reach it" in msg or "timed out" in msg.lower()
                                              or "did not complete" in msg), (name, msg)
        assert elapsed < 15, (name, elapsed)
    assert r0["then_callback_saw"] == [True], r0
    for name in ("future.wait", "then", "ddp"):
        assert r0[name + " then synchronize"] is None, (name, r0[name + " then synchronize"])
    # wait(timeout) gave up before the collective failed; the failure itself comes later, once
    pending = r0["wait(timeout) then synchronize"]
    assert pending is not None and "vccl: all_reduce" in pending, pending
    kind, msg, elapsed = r0["wait(timeout)"]
    assert kind == "DistBackendError" and "within the wait timeout of 500 ms" in msg, r0["wait(timeout)"]
    assert 0.4 < elapsed < 2.0, elapsed  # raised by wait() itself, not at a later synchronization


def _dead_peer_future(rank, ws, how):
    import signal
    dist.barrier()
    if rank == 1:
        if how == "kill":
            threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
        else:
            threading.Timer(0.5, lambda: os._exit(0)).start()
        return None
    time.sleep(2.0)
    t0 = time.perf_counter()
    x = torch.ones(4, device="vnpu")
    try:
        v = dist.all_reduce(x, async_op=True).get_future().wait()[0].cpu().tolist()
        res = ("no error", v)
    except RuntimeError as e:
        res = (type(e).__name__, str(e).splitlines()[0])
    # every later use of the group fails clearly
    try:
        dist.all_reduce(x)
        torch.vnpu.synchronize()
        later = "no error"
    except RuntimeError as e:
        later = str(e).splitlines()[0]
    return res, later, time.perf_counter() - t0


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_a_dead_peer_fails_reading_the_future_and_the_group(how):
    res = run_world(2, _dead_peer_future, how, init_kwargs={"timeout": datetime.timedelta(seconds=10)})
    (kind, msg), later, elapsed = res[0]
    assert kind in ("AcceleratorError", "DistBackendError") and "vccl: all_reduce" in msg, (kind, msg)
    assert "vccl: all_reduce" in later and "failed earlier" in later, later
    assert elapsed < 20, elapsed


def _dead_peer_never_waited(rank, ws, how):
    """Rank 1 dies; rank 0 issues async all_reduces it never waits on (fire and forget; the Work kept, dropped,
    or its future taken), then synchronizes the device, as code written for torch.cuda does
    (torch.cuda.synchronize() orders the host after NCCL's stream). That must raise, never hand back the
    un-reduced tensor; after the one report the device works again."""
    if _peer_dies(rank):
        return None
    x = torch.ones(4, device="vnpu")
    t0 = time.perf_counter()
    w = dist.all_reduce(x, async_op=True)
    if how == "dropped":
        del w
    elif how == "future":
        fut = w.get_future()  # taken, never waited  # noqa: F841
    try:
        if how == "waited late":
            time.sleep(7.0)  # past the group's timeout: the op failed, its hold-stream gate reported it
            w.wait()
        if how == "event query":  # a non-blocking download, polled with Event.query() (as cudaEventQuery)
            w.wait()
            h = torch.empty(4, pin_memory=True)
            h.copy_(x, non_blocking=True)
            e = torch.vnpu.Event()
            e.record()
            while not e.query():
                time.sleep(0.01)
            res = ("no error", h.tolist())
            raise StopIteration
        torch.vnpu.synchronize()
        res = ("no error", x.cpu().tolist())
    except StopIteration:
        pass
    except RuntimeError as e:
        res = (type(e).__name__, str(e))
    elapsed = time.perf_counter() - t0
    try:
        torch.vnpu.synchronize()
        again = None
    except RuntimeError as e:
        again = str(e)
    # reported once: the device is usable after it (a CUDA asynchronous error is also returned once)
    after = (torch.arange(3, device="vnpu") * 2).cpu().tolist()
    torch.vnpu.synchronize()
    return res, elapsed, after, again


@pytest.mark.parametrize("how", ["kept", "dropped", "future", "waited late", "event query"])
def test_a_failed_collective_nobody_waited_for_fails_the_next_synchronization(how):
    res = run_world(2, _dead_peer_never_waited, how, init_kwargs={"timeout": datetime.timedelta(seconds=5)})
    (kind, msg), elapsed, after, again = res[0]
    assert kind != "no error", f"the un-reduced tensor was returned: {msg}"
    assert "vccl: all_reduce" in msg, msg
    if how == "waited late":
        assert kind == "DistBackendError", (kind, msg)  # raised by wait() itself
    assert elapsed < 20, elapsed
    assert again is None, f"the failure was reported twice: {again}"
    assert after == [0, 2, 4]
