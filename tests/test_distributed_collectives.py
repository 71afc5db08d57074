"""vccl collectives on vnpu tensors, 2 processes, on both transports (shared memory and Gloo), against
oracles computed by hand.

Every rank builds every rank's input from a seed (``_inputs``), so each can compute the exact expected
result of a collective on CPU (float64/int64 arithmetic, cast back with the dtype's wrap-around) and
compare its own output. Rank functions return lists of failure descriptions; the tests assert they are
empty. Bad input (mismatches across ranks, wrong devices, bad arguments) must raise a clear error and
leave the group usable.
"""

import datetime
import time

import pytest
import torch
import torch.distributed as dist

from torch_vnpu.testing.distributed import RankFailure

R = dist.ReduceOp
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32, torch.uint64]
ALL_DTYPES = FLOATS + INTS + [torch.bool, torch.complex64] + FP8


@pytest.fixture(params=["shm", "gloo"])
def world(request):
    """Each test runs on both vccl transports: shared memory (the default on one host) and Gloo."""
    return request.getfixturevalue("world2" if request.param == "shm" else "world2_gloo")


# ---------------------------------------------------------------- helpers (run on the ranks)

def _inputs(world_size, shape, dtype, seed):
    """Every rank's input (CPU tensors), the same on every rank."""
    out = []
    for r in range(world_size):
        g = torch.Generator().manual_seed(seed * 1000 + r)
        if dtype == torch.bool:
            t = torch.rand(shape, generator=g) > 0.5
        elif dtype.is_floating_point or dtype.is_complex:
            t = (torch.randn(shape, generator=g, dtype=torch.float64) * 4).to(dtype)
            if dtype.is_complex:
                t = t + 1j * torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
        else:
            lo = 0 if dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64) else -20
            t = torch.randint(lo, 21, shape, generator=g, dtype=torch.int64).to(dtype)
        out.append(t)
    return out


def _wide(t):
    if t.dtype == torch.bool or not (t.dtype.is_floating_point or t.dtype.is_complex):
        return t.to(torch.int64)
    return t.to(torch.complex128 if t.dtype.is_complex else torch.float64)


def _reduce(xs, op, factor=None):
    """The reduction of CPU tensors xs as NCCL defines it (bool SUM = OR, integer AVG truncates)."""
    dt = xs[0].dtype
    ws = [_wide(x) for x in xs]
    acc = ws[0].clone()
    if op == "premul":
        acc = ws[0] * factor
        for w in ws[1:]:
            acc = acc + w * factor
    else:
        for w in ws[1:]:
            if op in (R.SUM, R.AVG):
                acc = acc + w
            elif op == R.PRODUCT:
                acc = acc * w
            elif op == R.MIN:
                acc = torch.minimum(acc, w)
            elif op == R.MAX:
                acc = torch.maximum(acc, w)
            elif op == R.BAND:
                acc = acc & w
            elif op == R.BOR:
                acc = acc | w
            elif op == R.BXOR:
                acc = acc ^ w
    if op == R.AVG:
        acc = torch.div(acc, len(xs), rounding_mode="trunc") if acc.dtype == torch.int64 else acc / len(xs)
    if dt == torch.bool:
        return acc != 0
    if acc.dtype == torch.int64 and dt != torch.int64:
        # two's complement wrap-around of the narrower integer type
        bits = torch.iinfo(dt).bits
        acc = acc & ((1 << bits) - 1) if bits < 64 else acc
        if dt.is_signed:
            acc = torch.where(acc >= (1 << (bits - 1)), acc - (1 << bits), acc)
    return acc.to(dt)


def _same(got, expected):
    """None if equal (floats within the dtype's tolerance), else a description."""
    got = got.cpu()
    if got.dtype in FP8:
        got, expected = got.float(), expected.float()
    try:
        if got.dtype.is_floating_point or got.dtype.is_complex:
            torch.testing.assert_close(got, expected, rtol=None, atol=None)
        else:
            assert torch.equal(got.to(torch.int64) if got.dtype != torch.bool else got,
                               expected.to(torch.int64) if expected.dtype != torch.bool else expected), \
                f"{got.tolist()} != {expected.tolist()}"
    except AssertionError as e:
        return str(e).splitlines()[0][:300]
    return None


def _valid(dtype, op):
    if op in (R.BAND, R.BOR, R.BXOR):
        return not (dtype.is_floating_point or dtype.is_complex)
    if dtype.is_complex:
        return op in (R.SUM, R.AVG, "premul")
    if dtype == torch.bool:
        return op not in (R.AVG, "premul")
    if op == "premul":
        return dtype.is_floating_point
    return True


OPS = [R.SUM, R.AVG, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR, "premul"]


# ---------------------------------------------------------------- reductions

def _all_reduce_cases(rank, ws):
    fails = []
    for i, dtype in enumerate(ALL_DTYPES):
        for j, op in enumerate(OPS):
            if not _valid(dtype, op):
                continue
            xs = _inputs(ws, (3, 5), dtype, seed=100 * i + j)
            t = xs[rank].to("vnpu")
            redop = dist._make_nccl_premul_sum(0.25) if op == "premul" else op
            dist.all_reduce(t, op=redop)
            err = _same(t, _reduce(xs, op, 0.25))
            if err:
                fails.append(f"all_reduce {dtype} {op}: {err}")
    return fails


def test_all_reduce_every_op_and_dtype(world):
    for fails in world.run(_all_reduce_cases):
        assert fails == []


def _uint64_big(rank, ws):
    big = [2**63 + 5, 7, 2**64 - 1]
    vals = [[big[0], 3, 2**63], [1, big[0], big[2]]]
    t = torch.tensor(vals[rank], dtype=torch.uint64, device="vnpu")
    lo, hi = t.clone(), t.clone()
    dist.all_reduce(lo, op=R.MIN)
    dist.all_reduce(hi, op=R.MAX)
    return lo.cpu().tolist(), hi.cpu().tolist()


def test_all_reduce_uint64_order_above_int64_range(world):
    for lo, hi in world.run(_uint64_big):
        assert lo == [1, 3, 2**63]
        assert hi == [2**63 + 5, 2**63 + 5, 2**64 - 1]


def _premul_tensor_factor(rank, ws):
    xs = _inputs(ws, (8,), torch.float32, seed=7)
    t = xs[rank].to("vnpu")
    f = torch.tensor(0.5, device="vnpu") * (rank + 1)  # per-rank factor, as NCCL allows
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(f))
    expected = xs[0] * 0.5 + xs[1] * 1.0
    return _same(t, expected)


def test_premul_sum_with_a_device_tensor_factor(world):
    assert world.run(_premul_tensor_factor) == [None, None]


def _reduce_cases(rank, ws):
    fails = []
    for i, dtype in enumerate([torch.float32, torch.bfloat16, torch.int32, torch.int16, torch.float8_e4m3fn]):
        for root in range(ws):
            for op in (R.SUM, R.MAX, R.AVG):
                if not _valid(dtype, op):
                    continue
                xs = _inputs(ws, (4, 3), dtype, seed=300 + 10 * i + root)
                t = xs[rank].to("vnpu")
                dist.reduce(t, dst=root, op=op)
                if rank == root:
                    err = _same(t, _reduce(xs, op))
                    if err:
                        fails.append(f"reduce {dtype} {op} root {root}: {err}")
    return fails


def test_reduce(world):
    for fails in world.run(_reduce_cases):
        assert fails == []


def _reduce_scatter_cases(rank, ws):
    fails = []
    for i, dtype in enumerate([torch.float32, torch.float16, torch.int64, torch.uint16, torch.complex64,
                               torch.float8_e5m2]):
        for op in (R.SUM, R.AVG, R.MAX, "premul"):
            if not _valid(dtype, op):
                continue
            redop = dist._make_nccl_premul_sum(2.0) if op == "premul" else op
            xs = _inputs(ws, (ws * 3, 2), dtype, seed=500 + 10 * i)
            expected = _reduce(xs, op, 2.0).chunk(ws)[rank]
            # tensor form
            out = torch.empty(3, 2, dtype=dtype, device="vnpu")
            inp = xs[rank].to("vnpu")
            dist.reduce_scatter_tensor(out, inp, op=redop)
            err = _same(out, expected)
            if err:
                fails.append(f"reduce_scatter_tensor {dtype} {op}: {err}")
            if _same(inp, xs[rank]):
                fails.append(f"reduce_scatter_tensor {dtype} {op} modified its input")
            # list form
            if not dtype.is_complex:  # the list API has no complex view_as_real path upstream
                out2 = torch.empty(3, 2, dtype=dtype, device="vnpu")
                dist.reduce_scatter(out2, list(inp.chunk(ws)), op=redop)
                err = _same(out2, expected)
                if err:
                    fails.append(f"reduce_scatter {dtype} {op}: {err}")
    return fails


def test_reduce_scatter(world):
    for fails in world.run(_reduce_scatter_cases):
        assert fails == []


# ---------------------------------------------------------------- data movement

def _broadcast_cases(rank, ws):
    fails = []
    for i, dtype in enumerate(ALL_DTYPES):
        for root in range(ws):
            xs = _inputs(ws, (2, 3), dtype, seed=700 + i)
            t = xs[rank].to("vnpu")
            dist.broadcast(t, src=root)
            err = _same(t, xs[root])
            if err:
                fails.append(f"broadcast {dtype} root {root}: {err}")
    return fails


def test_broadcast_every_dtype(world):
    for fails in world.run(_broadcast_cases):
        assert fails == []


def _all_gather_cases(rank, ws):
    fails = []
    for i, dtype in enumerate(ALL_DTYPES):
        xs = _inputs(ws, (2, 3), dtype, seed=900 + i)
        out = torch.empty(ws * 2, 3, dtype=dtype, device="vnpu")
        dist.all_gather_into_tensor(out, xs[rank].to("vnpu"))
        err = _same(out, torch.cat(xs))
        if err:
            fails.append(f"all_gather_into_tensor {dtype}: {err}")
        outs = [torch.empty(2, 3, dtype=dtype, device="vnpu") for _ in range(ws)]
        dist.all_gather(outs, xs[rank].to("vnpu"))
        for r in range(ws):
            err = _same(outs[r], xs[r])
            if err:
                fails.append(f"all_gather {dtype} from {r}: {err}")
    # uneven sizes across ranks (list form)
    xs = [torch.arange(r + 2, dtype=torch.float32) + 10 * r for r in range(ws)]
    outs = [torch.empty(r + 2, device="vnpu") for r in range(ws)]
    dist.all_gather(outs, xs[rank].to("vnpu"))
    for r in range(ws):
        err = _same(outs[r], xs[r])
        if err:
            fails.append(f"uneven all_gather from {r}: {err}")
    # in place: the input is this rank's chunk of the output
    out = torch.zeros(ws, 4, device="vnpu")
    out[rank] = rank + 1
    dist.all_gather_into_tensor(out, out[rank])
    err = _same(out, torch.arange(1, ws + 1, dtype=torch.float32)[:, None].expand(ws, 4))
    if err:
        fails.append(f"in-place all_gather_into_tensor: {err}")
    return fails


def test_all_gather(world):
    for fails in world.run(_all_gather_cases):
        assert fails == []


def _coalesced_cases(rank, ws):
    fails = []
    dev = torch.device("vnpu", rank)
    xs = [_inputs(ws, (k + 1, 2), torch.float32, seed=1100 + k) for k in range(3)]
    # all_reduce fast path (allreduce_coalesced)
    ts = [x[rank].to(dev) for x in xs]
    with dist._coalescing_manager(device=dev, async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    for k, t in enumerate(ts):
        err = _same(t, _reduce(xs[k], R.SUM))
        if err:
            fails.append(f"coalesced all_reduce {k}: {err}")
    # all_gather_into_tensor and reduce_scatter_tensor fast paths
    outs = [torch.empty(ws * (k + 1), 2, device=dev) for k in range(3)]
    with dist._coalescing_manager(device=dev):
        for k in range(3):
            dist.all_gather_into_tensor(outs[k], xs[k][rank].to(dev))
    for k in range(3):
        err = _same(outs[k], torch.cat(xs[k]))
        if err:
            fails.append(f"coalesced all_gather_into_tensor {k}: {err}")
    ys = [_inputs(ws, (ws * (k + 1), 2), torch.float32, seed=1200 + k) for k in range(3)]
    outs = [torch.empty(k + 1, 2, device=dev) for k in range(3)]
    with dist._coalescing_manager(device=dev):
        for k in range(3):
            dist.reduce_scatter_tensor(outs[k], ys[k][rank].to(dev), op=R.AVG)
    for k in range(3):
        err = _same(outs[k], _reduce(ys[k], R.AVG).chunk(ws)[rank])
        if err:
            fails.append(f"coalesced reduce_scatter_tensor {k}: {err}")
    # all_gather_coalesced (list of lists)
    outl = [[torch.empty(k + 1, 2, device=dev) for _ in range(ws)] for k in range(3)]
    dist.all_gather_coalesced(outl, [x[rank].to(dev) for x in xs])
    for k in range(3):
        for r in range(ws):
            err = _same(outl[k][r], xs[k][r])
            if err:
                fails.append(f"all_gather_coalesced {k} from {r}: {err}")
    # all_reduce_coalesced
    ts = [x[rank].to(dev) for x in xs]
    dist.all_reduce_coalesced(ts, op=R.MAX)
    for k, t in enumerate(ts):
        err = _same(t, _reduce(xs[k], R.MAX))
        if err:
            fails.append(f"all_reduce_coalesced {k}: {err}")
    return fails


def test_coalesced_collectives(world):
    for fails in world.run(_coalesced_cases):
        assert fails == []


def _all_to_all_cases(rank, ws):
    fails = []
    for i, dtype in enumerate([torch.float32, torch.bfloat16, torch.int64, torch.uint32, torch.bool,
                               torch.float8_e4m3fn, torch.complex64]):
        # equal splits
        xs = _inputs(ws, (ws * 2, 3), dtype, seed=1300 + i)
        out = torch.empty(ws * 2, 3, dtype=dtype, device="vnpu")
        dist.all_to_all_single(out, xs[rank].to("vnpu"))
        expected = torch.cat([xs[r].chunk(ws)[rank] for r in range(ws)])
        err = _same(out, expected)
        if err:
            fails.append(f"all_to_all_single {dtype}: {err}")
    # uneven splits: rank r sends (r + 1) * (p + 1) rows to rank p
    def splits(r):
        return [(r + 1) * (p + 1) for p in range(ws)]
    xs = [torch.arange(sum(splits(r)) * 2, dtype=torch.float32).reshape(-1, 2) + 1000 * r for r in range(ws)]
    out_splits = [splits(r)[rank] for r in range(ws)]
    out = torch.empty(sum(out_splits), 2, device="vnpu")
    dist.all_to_all_single(out, xs[rank].to("vnpu"), out_splits, splits(rank))
    expected = torch.cat([xs[r].split(splits(r))[rank] for r in range(ws)])
    err = _same(out, expected)
    if err:
        fails.append(f"uneven all_to_all_single: {err}")
    # list form with different sizes per pair
    ins = [torch.full((rank + p + 1,), float(10 * rank + p), device="vnpu") for p in range(ws)]
    outs = [torch.empty(r + rank + 1, device="vnpu") for r in range(ws)]
    dist.all_to_all(outs, ins)
    for r in range(ws):
        err = _same(outs[r], torch.full((r + rank + 1,), float(10 * r + rank)))
        if err:
            fails.append(f"all_to_all from {r}: {err}")
    return fails


def test_all_to_all(world):
    for fails in world.run(_all_to_all_cases):
        assert fails == []


def _gather_scatter_cases(rank, ws):
    fails = []
    for root in range(ws):
        for i, dtype in enumerate([torch.float32, torch.int16, torch.float8_e5m2]):
            xs = _inputs(ws, (3,), dtype, seed=1500 + i)
            lst = [torch.empty(3, dtype=dtype, device="vnpu") for _ in range(ws)] if rank == root else None
            dist.gather(xs[rank].to("vnpu"), lst, dst=root)
            if rank == root:
                for r in range(ws):
                    err = _same(lst[r], xs[r])
                    if err:
                        fails.append(f"gather {dtype} root {root} from {r}: {err}")
            out = torch.empty(3, dtype=dtype, device="vnpu")
            lst = [x.to("vnpu") for x in xs] if rank == root else None
            dist.scatter(out, lst, src=root)
            err = _same(out, xs[rank])
            if err:
                fails.append(f"scatter {dtype} root {root}: {err}")
    return fails


def test_gather_scatter(world):
    for fails in world.run(_gather_scatter_cases):
        assert fails == []


# ---------------------------------------------------------------- point to point

def _p2p_cases(rank, ws):
    fails = []
    peer = 1 - rank
    # send-before-recv on both ranks (isend/irecv): must not deadlock
    big = torch.full((1 << 20,), float(rank), device="vnpu")  # 4 MiB
    got = torch.empty(1 << 20, device="vnpu")
    s = dist.isend(big, peer)
    r = dist.irecv(got, peer)
    s.wait()
    r.wait()
    if _same(got, torch.full((1 << 20,), float(peer))):
        fails.append("isend/irecv exchange")
    # tags: two messages received in the opposite order of sending
    if rank == 0:
        dist.send(torch.tensor([1.0], device="vnpu"), 1, tag=11)
        dist.send(torch.tensor([2.0], device="vnpu"), 1, tag=22)
    else:
        a, b = torch.empty(1, device="vnpu"), torch.empty(1, device="vnpu")
        wb = dist.irecv(b, 0, tag=22)
        wa = dist.irecv(a, 0, tag=11)
        wb.wait()
        wa.wait()
        if (a.item(), b.item()) != (1.0, 2.0):
            fails.append(f"tags: got {a.item()}, {b.item()}")
    # every dtype moves as bytes
    for i, dtype in enumerate(ALL_DTYPES):
        xs = _inputs(ws, (5,), dtype, seed=1700 + i)
        if rank == 0:
            dist.send(xs[0].to("vnpu"), 1)
        else:
            t = torch.empty(5, dtype=dtype, device="vnpu")
            dist.recv(t, 0)
            err = _same(t, xs[0])
            if err:
                fails.append(f"send/recv {dtype}: {err}")
    # receive from any source
    if rank == 1:
        t = torch.empty(2, device="vnpu")
        src = dist.recv(t)
        if src != 0 or t.tolist() != [3.0, 4.0]:
            fails.append(f"recv any source: {src} {t.tolist()}")
    else:
        dist.send(torch.tensor([3.0, 4.0], device="vnpu"), 1)
    # batch_isend_irecv (coalesced): a ring exchange
    send = torch.full((3,), float(rank), device="vnpu")
    recv = torch.empty(3, device="vnpu")
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % ws), dist.P2POp(dist.irecv, recv, (rank - 1) % ws)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    if recv.tolist() != [float((rank - 1) % ws)] * 3:
        fails.append(f"batch_isend_irecv: {recv.tolist()}")
    return fails


def test_point_to_point(world):
    for fails in world.run(_p2p_cases):
        assert fails == []


def _backend_caps(rank, ws):
    b = dist.group.WORLD._get_backend(torch.device("vnpu"))
    return type(b).__name__, b.supports_coalescing, b.supports_splitting, dist.get_backend_config(), b.transport


def test_backend_registration(world, request):
    for name, coalescing, splitting, config, transport in world.run(_backend_caps):
        assert name == "ProcessGroupVCCL"
        assert coalescing and splitting
        assert config == "cpu:gloo,vnpu:vccl"
        assert transport == request.node.callspec.params["world"]


# ---------------------------------------------------------------- Work, streams, memory

def _async_semantics(rank, ws):
    out = {}
    a = torch.randn(600, 600, device="vnpu")
    x = a @ a  # queue work on the stream before the collective
    t0 = time.perf_counter()
    w = dist.all_reduce(x, async_op=True)
    out["issue_s"] = time.perf_counter() - t0
    w.wait()  # the current stream waits; the host does not
    out["wait_s"] = time.perf_counter() - t0
    y = x.sum().item()
    out["completed"] = w.is_completed()
    out["success"] = w.is_success() if hasattr(w, "is_success") else True
    out["sum"] = y
    # get_future carries the output tensors (DDP comm hooks rely on it)
    z = torch.full((4,), float(rank + 1), device="vnpu")
    fut = dist.all_reduce(z, async_op=True).get_future()
    vals = fut.then(lambda f: f.value()[0] * 10).wait()
    out["future"] = vals.cpu().tolist()
    # collectives on a side stream, consumed on the default stream after wait()
    s = torch.vnpu.Stream()
    with torch.vnpu.stream(s):
        u = torch.full((1000,), 1.0, device="vnpu") * (rank + 1)
        wu = dist.all_reduce(u, async_op=True)
    wu.wait()
    out["side_stream"] = (u * 2).sum().item()
    return out


def test_work_is_asynchronous_and_stream_ordered(world):
    res = world.run(_async_semantics)
    for r in res:
        assert r["completed"]
        assert r["future"] == [30.0] * 4
        assert r["side_stream"] == 2 * 1000 * 3.0
    assert res[0]["sum"] == pytest.approx(res[1]["sum"], rel=1e-6)


def _not_completed_at_issue(rank, ws):
    # rank 1 enters the collective late, so rank 0's Work cannot be complete right after issue
    x = torch.ones(16, device="vnpu")
    if rank == 1:
        time.sleep(1.0)
    w = dist.all_reduce(x, async_op=True)
    done_at_issue = w.is_completed()
    w.wait()
    return done_at_issue, x.cpu().tolist()


def test_async_op_returns_before_completion(world):
    res = world.run(_not_completed_at_issue)
    assert res[0][0] is False
    assert res[0][1] == res[1][1] == [2.0] * 16


def _freed_input_not_reused(rank, ws):
    # rank 0 frees its input right after issuing and writes garbage into fresh allocations on the
    # same stream; rank 1 starts late, so without the hold-stream record the transport would read
    # the garbage.
    n = 1 << 18
    inp = torch.full((n,), float(rank + 1), device="vnpu")
    out = torch.empty(ws * n, device="vnpu")
    if rank == 1:
        time.sleep(0.5)
    w = dist.all_gather_into_tensor(out, inp, async_op=True)
    del inp
    junk = [torch.full((n,), -7.0, device="vnpu") for _ in range(4)]
    w.wait()
    ok = torch.equal(out.cpu(), torch.cat([torch.full((n,), float(r + 1)) for r in range(ws)]))
    del junk
    return ok


def test_freed_tensors_are_not_reused_before_the_collective_finished(world):
    assert world.run(_freed_input_not_reused) == [True, True]


# ---------------------------------------------------------------- groups

def _groups(rank, ws):
    fails = []
    g = dist.new_group([0, 1])
    t = torch.full((2,), float(rank), device="vnpu")
    dist.all_reduce(t, group=g)
    if t.tolist() != [1.0, 1.0]:
        fails.append(f"new_group all_reduce {t.tolist()}")
    g0 = dist.new_group([0])
    if rank == 0:
        t = torch.full((2,), 5.0, device="vnpu")
        dist.all_reduce(t, group=g0)
        if t.tolist() != [5.0, 5.0]:
            fails.append(f"single-rank group {t.tolist()}")
    vonly = dist.new_group([0, 1], backend="vccl")
    t = torch.ones(3, device="vnpu")
    dist.all_reduce(t, group=vonly)
    if t.tolist() != [2.0] * 3:
        fails.append(f"vccl-only group {t.tolist()}")
    try:
        dist.all_reduce(torch.ones(3), group=vonly)
        fails.append("cpu tensor in a vccl-only group did not raise")
    except RuntimeError as e:
        if "cpu" not in str(e):
            fails.append(f"cpu tensor error does not name the device: {e}")
        # the error says what to do (a note, shown with the traceback), for every collective
        if "cpu:gloo,vnpu:vccl" not in "".join(getattr(e, "__notes__", [])) or "tensor.to('vnpu')" not in e.__notes__[0]:
            fails.append(f"cpu tensor error says not what to do: {getattr(e, '__notes__', None)}")
    for call in (lambda: dist.broadcast(torch.ones(2), 0, group=vonly),
                 lambda: dist.all_gather_into_tensor(torch.empty(4), torch.ones(2), group=vonly)):
        try:
            call()
            fails.append("cpu tensor in a vccl-only group did not raise")
        except RuntimeError as e:
            if len(getattr(e, "__notes__", [])) != 1:
                fails.append(f"notes: {getattr(e, '__notes__', None)}")
    t = torch.ones(3, device="vnpu")
    dist.all_reduce(t, group=vonly)  # the group stays usable
    if t.tolist() != [2.0] * 3:
        fails.append(f"vccl-only group after the error {t.tolist()}")
    for grp in (g, g0, vonly):
        if grp is not None and grp != dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(grp)
    return fails


def test_new_group(world):
    for fails in world.run(_groups):
        assert fails == []


def _nested_future_waits(rank, ws):
    """A then() callback that waits on another collective of the same group (what PowerSGD's DDP hook does): it
    deadlocked, both ranks stuck in the group's one completion thread."""
    import torch.nn as nn
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
    from torch.nn.parallel import DistributedDataParallel as DDP

    a = torch.ones(4, device="vnpu")
    b = torch.full((4,), float(rank + 1), device="vnpu")
    nested = dist.all_reduce(a, async_op=True).get_future().then(
        lambda f: dist.all_reduce(b, async_op=True).get_future().wait()[0]).wait()
    # A collective issued in a callback is issued in program order, before the collective the caller issues
    # next, on every rank (NCCL's futures run then() inline): with rank 1 late, callbacks that ran on a
    # completion thread reduced y with z (y = 210/120, z = 120/210).
    x = torch.ones(4, device="vnpu")
    y = torch.full((4,), 10.0 * (rank + 1), device="vnpu")
    z = torch.full((4,), 100.0 * (rank + 1), device="vnpu")
    f = dist.all_reduce(x, async_op=True).get_future().then(
        lambda _: dist.all_reduce(y, async_op=True).get_future().wait())
    if rank == 1:
        time.sleep(0.5)
    dist.all_reduce(z)
    f.wait()
    order = (y.tolist(), z.tolist())
    # A callback sees the caller's stream as of then(): here the buffer it all-reduces is written on the current
    # stream after the first collective was issued (PowerSGD writes P so). Callbacks ran on a pool stream ordered
    # only after the future's events and all-reduced the half-written buffer (27 of 30 iterations wrong).
    big = torch.randn(300, 300, device="vnpu")
    p = torch.zeros(300, device="vnpu")
    late = []
    for i in range(10):
        p.zero_()
        fut = dist.all_reduce(torch.ones(1, device="vnpu"), async_op=True).get_future()
        q = big
        for _ in range(3):
            q = torch.tanh(q @ big)
        torch.mul(q.sum(1) * 0 + 1, float(i + 1), out=p)
        got = fut.then(lambda _: dist.all_reduce(p, async_op=True).get_future().wait()[0]).wait()
        late.append(bool((got == ws * (i + 1)).all()))
    def train():
        torch.manual_seed(0)
        # several buckets: PowerSGD's hook issues collectives from callbacks while the backward pass issues the
        # next bucket's
        model = DDP(nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16)) for _ in range(4)],
                                  nn.Linear(16, 4)).to("vnpu"), bucket_cap_mb=0.001)
        model.register_comm_hook(powersgd.PowerSGDState(None, matrix_approximation_rank=2, start_powerSGD_iter=2),
                                 powersgd.powerSGD_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(rank)
        for _ in range(8):  # steps 3 to 8 compress (nested futures inside the hook)
            opt.zero_grad()
            model(torch.randn(8, 16, generator=g).to("vnpu")).square().mean().backward()
            opt.step()
        return model

    model = train()
    # the same run again gives the same weights (racing hooks gave different ones on every run, ranks agreeing)
    again = torch.cat([p.detach().flatten() for p in train().parameters()])
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(params) for _ in range(ws)]
    dist.all_gather(gathered, params)
    return (nested.tolist(), a.tolist(), order, late, len(model.reducer._get_zeros_like_grad_buckets()),
            all(torch.equal(gathered[0], p) for p in gathered) and torch.equal(params, again),
            bool(params.isfinite().all()))


def test_a_callback_may_wait_for_another_collective(world):
    for nested, a, order, late, buckets, same, finite in world.run(_nested_future_waits, timeout=120):
        assert nested == [3.0] * 4 and a == [2.0] * 4  # 1 + 2 and 1 + 1
        assert order == ([30.0] * 4, [300.0] * 4), order
        assert all(late), late
        assert buckets > 1, buckets
        assert same and finite  # DDP with PowerSGD: replicas stay identical


def _functional(rank, ws):
    import torch.distributed._functional_collectives as fc

    fails = []
    x = torch.arange(4, dtype=torch.float32, device="vnpu") + rank
    y = fc.all_reduce(x, "sum", dist.group.WORLD)
    if _same(y, torch.arange(4, dtype=torch.float32) * 2 + 1):
        fails.append(f"fc.all_reduce {y}")
    g = fc.all_gather_tensor(x, 0, dist.group.WORLD)
    if _same(g, torch.cat([torch.arange(4.0) + r for r in range(ws)])):
        fails.append(f"fc.all_gather_tensor {g}")
    rs = fc.reduce_scatter_tensor(torch.ones(4, device="vnpu") * (rank + 1), "avg", 0, dist.group.WORLD)
    if _same(rs, torch.full((2,), 1.5)):
        fails.append(f"fc.reduce_scatter_tensor {rs}")
    a2a = fc.all_to_all_single(torch.arange(4.0, device="vnpu") + 10 * rank, None, None, dist.group.WORLD)
    exp = torch.cat([(torch.arange(4.0) + 10 * r).chunk(ws)[rank] for r in range(ws)])
    if _same(a2a, exp):
        fails.append(f"fc.all_to_all_single {a2a}")
    # the raw _c10d_functional ops, as compiled code emits them
    name = dist.group.WORLD.group_name
    z = torch.ops._c10d_functional.all_reduce(torch.ones(3, device="vnpu"), "sum", name)
    z = torch.ops._c10d_functional.wait_tensor(z)
    if z.tolist() != [2.0] * 3:
        fails.append(f"_c10d_functional.all_reduce {z}")
    return fails


def test_functional_collectives(world):
    for fails in world.run(_functional):
        assert fails == []


def _barriers(rank, ws):
    if rank == 1:
        time.sleep(0.5)
    t0 = time.perf_counter()
    dist.barrier()
    waited = time.perf_counter() - t0
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
    return waited


def test_barrier_blocks_the_host_until_every_rank_arrived(world):
    waited = world.run(_barriers)
    assert waited[0] > 0.3  # rank 0 waited for rank 1


# ---------------------------------------------------------------- bad input

def _bad_input(rank, ws):
    """(case, exception type name, message) per case; the group must stay usable after each."""
    res = []

    def expect(case, fn):
        try:
            fn()
            torch.vnpu.synchronize()
            res.append((case, None, ""))
        except Exception as e:  # noqa: BLE001
            res.append((case, type(e).__name__, str(e).splitlines()[0]))
        t = torch.ones(2, device="vnpu")
        dist.all_reduce(t)
        if t.tolist() != [2.0, 2.0]:
            res.append((case + " (group unusable afterwards)", "broken", str(t.tolist())))

    expect("shape", lambda: dist.all_reduce(torch.ones(3 + rank, device="vnpu")))
    expect("dtype", lambda: dist.all_reduce(torch.ones(3, device="vnpu",
                                                       dtype=torch.float32 if rank else torch.float64)))
    expect("op", lambda: dist.all_reduce(torch.ones(3, device="vnpu"), op=R.MAX if rank else R.SUM))
    expect("collective", lambda: dist.all_reduce(torch.ones(3, device="vnpu")) if rank == 0
           else dist.broadcast(torch.ones(3, device="vnpu"), 0))
    expect("splits", lambda: dist.all_to_all_single(torch.empty(4, device="vnpu"), torch.ones(4, device="vnpu"),
                                                    [2, 2] if rank else [1, 3], [2, 2]))
    expect("noncontiguous", lambda: dist.all_reduce(torch.ones(4, 4, device="vnpu").t()[:, :2]))
    expect("band_float", lambda: dist.all_reduce(torch.ones(3, device="vnpu"), op=R.BAND))
    expect("e8m0_sum", lambda: dist.all_reduce(torch.ones(3, device="vnpu").to(torch.float8_e8m0fnu)))
    expect("e8m0_broadcast", lambda: dist.broadcast(torch.ones(3, device="vnpu").to(torch.float8_e8m0fnu), 0))
    expect("list_length", lambda: dist.all_gather([torch.empty(2, device="vnpu")] * 3, torch.ones(2, device="vnpu")))
    expect("wrong_device", lambda: dist.all_gather_into_tensor(torch.empty(4, device="vnpu:0"),
                                                               torch.ones(2, device="vnpu:1")))
    # point to point: the receiver names the sizes (Gloo itself would abort the process)
    expect("p2p_size", lambda: dist.send(torch.ones(4, device="vnpu"), 1) if rank == 0
           else dist.recv(torch.empty(3, device="vnpu"), 0))
    expect("p2p_dtype", lambda: dist.send(torch.ones(4, device="vnpu"), 1) if rank == 0
           else dist.recv(torch.empty(4, device="vnpu", dtype=torch.int32), 0))
    # per-tensor sizes differ though the totals agree (coalesced): must not reduce mismatched buffers
    expect("coalesced_sizes", lambda: dist.all_reduce_coalesced(
        [torch.ones(3 if rank == 0 else 5, device="vnpu"), torch.ones(5 if rank == 0 else 3, device="vnpu")]))
    # sparse vnpu tensors: an error, not a collective on host copies that leaves the tensor unchanged
    expect("sparse", lambda: dist.all_reduce((torch.arange(4.0) + 1).to_sparse().to("vnpu")))
    return res


def test_bad_input_raises_clear_errors_and_keeps_the_group(world):
    res = world.run(_bad_input)
    for rank, cases in enumerate(res):
        d = {c: (t, m) for c, t, m in cases}
        assert not any("unusable" in c for c in d), cases
        for case in ("shape", "dtype", "op", "collective", "splits"):
            typ, msg = d[case]
            # raised by wait() when the check already failed, else at the next synchronization
            assert typ in ("DistBackendError", "AcceleratorError"), (case, typ, msg)
            assert f"on rank {rank}" in msg, (case, msg)
        for case in ("shape", "dtype", "op", "collective"):
            assert "rank 1 " in d[case][1] and "rank 0 " in d[case][1], d[case]  # names both sides
        assert "rank 0 sends 2 rows to rank 0 but rank 0 expects 1 rows" in d["splits"][1]
        assert "rank 1 passed 4 elements (shape [4]) but rank 0 passed 3 elements (shape [3])" in d["shape"][1]
        assert "dtype" in d["dtype"][1]
        assert "called broadcast" in d["collective"][1] or "called all_reduce" in d["collective"][1]
        assert d["noncontiguous"][0] == "ValueError" and "contiguous" in d["noncontiguous"][1]
        assert d["band_float"][0] == "TypeError"
        assert d["e8m0_sum"][0] == "TypeError" and "cannot reduce" in d["e8m0_sum"][1]
        assert d["e8m0_broadcast"][0] is None  # moved as bytes
        assert d["list_length"][0] == "ValueError" and "one tensor per rank" in d["list_length"][1]
        assert d["wrong_device"][0] == "ValueError" and "one device" in d["wrong_device"][1]
        typ, msg = d["coalesced_sizes"]
        assert typ in ("DistBackendError", "AcceleratorError") and "element counts or dtypes differ" in msg, (typ, msg)
        assert d["sparse"][0] == "NotImplementedError" and "sparse vnpu tensors" in d["sparse"][1], d["sparse"]
        if rank == 1:
            assert "rank 0 sent 16 bytes of Float but this receive expects 12 bytes of Float" in d["p2p_size"][1]
            assert "expects 16 bytes of Int" in d["p2p_dtype"][1]
        else:
            assert d["p2p_size"][0] is None and d["p2p_dtype"][0] is None  # the sender's data was taken


def _assert_fails(rank, ws):
    raise ValueError(f"boom on rank {rank}")


def _work_exception(rank, ws):
    w = dist.all_reduce(torch.ones(2 + rank, device="vnpu"), async_op=True)
    deadline = time.monotonic() + 30
    while not w.is_completed() and time.monotonic() < deadline:  # polling never blocks a stream
        time.sleep(0.01)
    exc = w.exception()
    try:
        w.wait()
        raised = None
    except RuntimeError as e:
        raised = type(e).__name__
    return w.is_completed(), w.is_success(), str(exc), raised


def test_work_reports_a_failure_through_exception_and_wait(world):
    for completed, success, exc, raised in world.run(_work_exception):
        assert completed and not success
        assert "passed 3 elements" in exc and raised == "DistBackendError"


def test_harness_reports_rank_failures(world):
    with pytest.raises(RankFailure, match="boom on rank 1"):
        world.run(_assert_fails)
