"""Small porting-bug programs for tests/test_sanitizer.py, each with its correct fix.

Every case returns (vnpu result on the CPU, the CPU oracle). Run as a script,
``python sanitizer_cases.py CASE FIX``, it prints one JSON line: {"ok": max abs
difference} or {"error": exception type name, "message": ...}; the test runs it
with VNPU_SANITIZE=1 in a fresh process (the sanitizer is per process).
"""

import json
import sys

import torch

N = 1 << 16
BUSY_NS = 250_000_000  # keeps a stream busy for 250 ms, so a missing ordering shows as a wrong result
_calls = [0]


def values() -> torch.Tensor:
    """Inputs that differ per call, so stale memory of an earlier call never looks right."""
    _calls[0] += 1
    return torch.arange(N, dtype=torch.float32) + 1000 * _calls[0]


def free_without_record_stream(fix: bool):
    """A tensor made on the default stream, read on a side stream, dropped: its block is reused on the
    default stream while the side stream may still read it. Fix: record_stream."""
    main, side = torch.vnpu.current_stream(), torch.vnpu.Stream()
    v = values()
    a = v.to("vnpu")
    expected = v * 2
    side.wait_stream(main)
    with torch.vnpu.stream(side):
        torch.vnpu._sleep(BUSY_NS)
        out = a * 2
    if fix:
        a.record_stream(side)
    del a
    b = torch.full((N,), 7.0, device="vnpu")  # the default stream reuses a's block (without the fix)
    torch.vnpu.synchronize()
    del b
    return out.cpu(), expected


def missing_wait_stream(fix: bool):
    """A side stream reads what the default stream is still producing. Fix: wait_stream."""
    main, side = torch.vnpu.current_stream(), torch.vnpu.Stream()
    v = values()
    x = v.to("vnpu")
    torch.vnpu._sleep(BUSY_NS)
    y = x * 3
    if fix:
        side.wait_stream(main)
    with torch.vnpu.stream(side):
        z = y + 1
    torch.vnpu.synchronize()
    return z.cpu(), v * 3 + 1


def host_op_reads_side_stream(fix: bool):
    """A data-dependent op (runs on the host after syncing the current stream only) reads a tensor a side
    stream is still writing. Fix: the current stream waits for the side stream."""
    main, side = torch.vnpu.current_stream(), torch.vnpu.Stream()
    x = torch.zeros(N, device="vnpu")
    side.wait_stream(main)
    with torch.vnpu.stream(side):
        torch.vnpu._sleep(BUSY_NS)
        x.fill_(1.0)
    if fix:
        main.wait_stream(side)
    n = x.nonzero().shape[0]
    torch.vnpu.synchronize()
    return torch.tensor([float(n)]), torch.tensor([float(N)])


def use_after_free(fix: bool):
    """A tensor built over another tensor's data_ptr() (no ownership, as raw-pointer or DLPack code makes
    them), used after the owner died; the freed block is then handed out again. Fix: keep the owner alive."""
    m = 1 << 20  # 4 MiB: the large pool, apart from the small outputs below
    a = torch.ones(m, device="vnpu")
    storage = torch._C._construct_storage_from_data_pointer(a.data_ptr(), a.device, a.nbytes)
    alias = torch.empty(0, device="vnpu").set_(storage, 0, (m,), (1,))
    keep = a if fix else None
    del a
    first = alias.sum()
    b = torch.zeros(m, device="vnpu")  # reuses the freed block (without the fix)
    second = alias.sum()
    torch.vnpu.synchronize()
    del keep, b
    return torch.stack([first, second]).cpu(), torch.tensor([float(m), float(m)])


def nonblocking_copy_read_early(fix: bool):
    """A non_blocking device->host copy into pinned memory read before synchronizing. Fix: synchronize
    (the stream, the device, or an event recorded after the copy) before reading."""
    v = values()
    x = v.to("vnpu")
    torch.vnpu._sleep(BUSY_NS)
    y = x * 2
    h = torch.empty(N, dtype=torch.float32, pin_memory=True)
    h.copy_(y, non_blocking=True)
    if fix:
        torch.vnpu.current_stream().synchronize()
    got = h.clone()  # the read
    torch.vnpu.synchronize()
    return got, v * 2


def graph_replay_race(fix: bool):
    """A side stream writes a graph's static input while a replay on the default stream reads it, with
    nothing ordering the two. Fix: the replaying stream waits for the side stream (wait_stream or an event)."""
    main = torch.vnpu.current_stream()
    static_x = torch.zeros(N, device="vnpu")
    g = torch.vnpu.VNPUGraph()
    with torch.vnpu.graph(g):
        static_y = static_x * 2  # recorded, not run: no access until a replay
    v = values()
    new = v.to("vnpu")
    static_x.copy_(new)  # the current stream, after the capture: ordered before the replay below
    g.replay()
    torch.vnpu.synchronize()
    first = static_y.cpu()
    side = torch.vnpu.Stream()
    side.wait_stream(main)
    with torch.vnpu.stream(side):
        torch.vnpu._sleep(BUSY_NS)
        static_x.copy_(new + 1)
    if fix:
        main.wait_stream(side)
    g.replay()  # reads static_x on the default stream
    torch.vnpu.synchronize()
    return torch.cat([first, static_y.cpu()]), torch.cat([v * 2, (v + 1) * 2])


CASES = {f.__name__: f for f in (free_without_record_stream, missing_wait_stream, host_op_reads_side_stream,
                                 use_after_free, nonblocking_copy_read_early, graph_replay_race)}


def main() -> None:
    case, fix = sys.argv[1], sys.argv[2] == "1"
    try:
        got, expected = CASES[case](fix)
        print(json.dumps({"ok": float((got - expected).abs().max())}))
    except Exception as e:  # noqa: BLE001 - reported to the test
        print(json.dumps({"error": type(e).__name__, "message": str(e)}))


if __name__ == "__main__":
    main()
