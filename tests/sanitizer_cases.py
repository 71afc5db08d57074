"""Small porting-bug programs for tests/test_sanitizer.py, each with its correct fix.

Every case returns (vnpu result on the CPU, the CPU oracle). Run as a script,
``python sanitizer_cases.py CASE FIX``, it prints one JSON line: {"ok": max abs
difference} or {"error": exception type name, "message": ...}; the test runs it
with VNPU_SANITIZE=1 in a fresh process (the sanitizer is per process).
"""

import json
import sys
import time

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


def _read_on_side_then_drop(fix: bool, record_on_wrong_stream: bool = False):
    """x made on the default stream, read on a side stream, dropped; recorded on the side stream with ``fix``,
    on another stream with ``record_on_wrong_stream`` (and no fix)."""
    main, side = torch.vnpu.current_stream(), torch.vnpu.Stream()
    v = values()
    x = v.to("vnpu")
    side.wait_stream(main)
    with torch.vnpu.stream(side):
        torch.vnpu._sleep(BUSY_NS)
        out = x * 2
    if fix:
        x.record_stream(side)
    elif record_on_wrong_stream:
        x.record_stream(torch.vnpu.Stream())
    del x
    return out, v * 2


def free_without_record_stream_no_reuse(fix: bool):
    """A tensor made on the default stream, read on a side stream, dropped with nothing reusing its block
    before the program synchronizes: right by luck, a race all the same (the caching allocator may hand the
    block to the default stream's next allocation at the free). Fix: record_stream."""
    out, expected = _read_on_side_then_drop(fix)
    torch.vnpu.synchronize()  # the next vnpu call: a free cannot raise, the report comes here
    return out.cpu(), expected


def record_stream_on_the_wrong_stream(fix: bool):
    """A tensor read on one side stream is recorded on another (a typo among several streams) and dropped:
    the block is handed out again once the recorded stream passes the free, while the reading stream may
    still read it. Fix: record_stream on the stream that used it."""
    out, expected = _read_on_side_then_drop(fix, record_on_wrong_stream=True)
    torch.vnpu.synchronize()  # the next vnpu call: a free cannot raise, the report comes here
    return out.cpu(), expected


def free_race_reader_result(fix: bool):
    """The same with its report caught: the side stream's read still sees the tensor's values (the
    sanitizer's poison fill of the freed block waits for it)."""
    out, expected = _read_on_side_then_drop(fix)
    try:
        torch.vnpu.synchronize()
    except torch.vnpu.sanitizer.StreamRaceError:
        if fix:
            raise
    return out.cpu(), expected


def strided_slices_from_two_streams(fix: bool):
    """Two side streams write the channel halves out[:, :16] and out[:, 16:] of an NCHW tensor: disjoint,
    interleaved in memory, so no ordering is needed between them (a correct program). `fix` = False makes
    the second slice overlap the first by one channel (out[:, 15:]): a real race."""
    main = torch.vnpu.current_stream()
    s1, s2 = torch.vnpu.Stream(), torch.vnpu.Stream()
    out = torch.zeros(2, 32, 8, 8, device="vnpu")
    expected = torch.zeros(2, 32, 8, 8)
    s1.wait_stream(main)
    s2.wait_stream(main)
    lo = 16 if fix else 15
    with torch.vnpu.stream(s1):
        torch.vnpu._sleep(BUSY_NS // 5)
        out[:, :16].fill_(1.0)
    with torch.vnpu.stream(s2):
        out[:, lo:].fill_(2.0)
    expected[:, :16] = 1.0
    expected[:, lo:] = 2.0
    main.wait_stream(s1)
    main.wait_stream(s2)
    return out.cpu(), expected


def column_blocks_from_two_streams(fix: bool):
    """The same with the column blocks m[:, :8] and m[:, 8:] of a matrix, read back by a third stream.
    `fix` = False: the reader skips waiting for the second writer."""
    main = torch.vnpu.current_stream()
    s1, s2, s3 = torch.vnpu.Stream(), torch.vnpu.Stream(), torch.vnpu.Stream()
    m = torch.zeros(64, 24, device="vnpu")
    s1.wait_stream(main)
    s2.wait_stream(main)
    with torch.vnpu.stream(s1):
        m[:, :8].add_(3.0)
    with torch.vnpu.stream(s2):
        torch.vnpu._sleep(BUSY_NS // 5)
        m[:, 8:].add_(4.0)
    s3.wait_stream(s1)
    if fix:
        s3.wait_stream(s2)
    with torch.vnpu.stream(s3):
        total = m.sum(dim=0)
    main.wait_stream(s3)
    return total.cpu(), torch.tensor([3.0 * 64] * 8 + [4.0 * 64] * 16)


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


def copy_reads_side_stream_output(fix: bool):
    """A copy (clone: a device-to-device memcpy) on the default stream reads what a side stream is still
    writing. Fix: the default stream waits for the side stream."""
    main, side = torch.vnpu.current_stream(), torch.vnpu.Stream()
    v = values()
    x = v.to("vnpu")
    side.wait_stream(main)
    with torch.vnpu.stream(side):
        torch.vnpu._sleep(BUSY_NS)
        y = x * 3
    if fix:
        main.wait_stream(side)
    z = y.clone()
    torch.vnpu.synchronize()
    return z.cpu(), v * 3


def race_caught_then_retried(fix: bool):
    """A program that catches the report and retries the same op (a notebook, a test harness): the same
    missing ordering is reported once, not at every retry (Note [One report per race]). Returns the number
    of reports against 1 (0 with the fix: wait_stream)."""
    main, side = torch.vnpu.current_stream(), torch.vnpu.Stream()
    x = values().to("vnpu")
    torch.vnpu._sleep(BUSY_NS)
    y = x * 3
    if fix:
        side.wait_stream(main)
    reports = 0
    for _ in range(3):
        try:
            with torch.vnpu.stream(side):
                y + 1
        except torch.vnpu.sanitizer.StreamRaceError:
            reports += 1
    torch.vnpu.synchronize()
    return torch.tensor(float(reports)), torch.tensor(0.0 if fix else 1.0)


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


def nonblocking_copy_other_stream_synced(fix: bool):
    """A non_blocking device->host copy on an idle stream (it would land at once), then the program
    synchronizes another stream and reads: right by timing, a race all the same (the read is ordered after
    nothing that waited for the copy). Fix: synchronize the copy's stream."""
    side = torch.vnpu.Stream()
    v = values()
    y = v.to("vnpu") * 2
    torch.vnpu.current_stream().synchronize()  # idle: unheld, the copy below runs at once
    h = torch.empty(N, dtype=torch.float32, pin_memory=True)
    h.copy_(y, non_blocking=True)
    if fix:
        torch.vnpu.current_stream().synchronize()
    else:
        side.synchronize()  # the wrong stream
    time.sleep(0.05)  # the copy has run by now unless it is held back
    got = h.clone()
    torch.vnpu.synchronize()
    return got, v * 2


def pinned_round_trip(fix: bool):
    """Correct (fix or not): a hop through pinned host memory, x.to("cpu", non_blocking=True).to("vnpu",
    non_blocking=True): the download writes the buffer the upload then reads, in stream order."""
    v = values()
    x = v.to("vnpu")
    torch.vnpu._sleep(BUSY_NS // 5)
    y = (x * 2).to("cpu", non_blocking=True).to("vnpu", non_blocking=True)
    return y.cpu(), v * 2


def pinned_upload_then_download_same_buffer(fix: bool):
    """Correct (fix or not): one pinned buffer is the source of an upload and then, on the same stream, the
    destination of a download (activation offloading, a bounce buffer), both queued behind busy work."""
    v = values()
    buf = v.clone().pin_memory()
    torch.vnpu._sleep(BUSY_NS // 5)
    d = buf.to("vnpu", non_blocking=True)  # reads buf when the stream gets there
    buf.copy_(d * 10, non_blocking=True)   # then writes it, in stream order
    torch.vnpu.synchronize()
    return torch.cat([d.cpu(), buf]), torch.cat([v, v * 10])


def poll_pinned_destination(fix: bool):
    """Polls the pinned destination of a non_blocking copy until the value appears, with no stream wait (a
    flag-polling pattern). The sanitizer holds the copy back until the host waits, but at most a second, so
    the loop ends (before: it never did). Fix: synchronize instead of polling."""
    x = torch.full((4,), 7.0, device="vnpu")
    h = torch.zeros(4, pin_memory=True)
    h.copy_(x, non_blocking=True)
    if fix:
        torch.vnpu.current_stream().synchronize()
    start = time.monotonic()
    while h[0].item() != 7.0:
        if time.monotonic() - start > 30:
            raise TimeoutError("the non_blocking copy never landed")
        time.sleep(0.001)
    return h.clone(), torch.full((4,), 7.0)


def pinned_staging_rewritten(fix: bool):
    """One pinned staging buffer refilled by the host for each batch while the previous non_blocking
    upload may still be queued (the stream is busy): the device gets later batches' values. Fix:
    synchronize the stream before refilling the buffer."""
    staging = torch.empty(N, dtype=torch.float32, pin_memory=True)
    torch.vnpu._sleep(BUSY_NS // 5)
    uploads, expected = [], []
    for _ in range(3):
        v = values()
        staging.copy_(v)  # host write
        uploads.append(staging.to("vnpu", non_blocking=True))
        expected.append(v)
        if fix:
            torch.vnpu.current_stream().synchronize()
    got = torch.cat([u.cpu() for u in uploads])
    return got, torch.cat(expected)


def pinned_staging_rewritten_then_item(fix: bool):
    """The staging buffer is refilled while its upload is queued, and the program's last vnpu call is an
    .item() of a result computed from the upload: the wait inside .item() must raise, not return the later
    batch's sum. Fix: synchronize the stream before refilling the buffer."""
    staging = torch.empty(N, dtype=torch.float32, pin_memory=True)
    torch.vnpu._sleep(BUSY_NS // 5)
    v = values()
    staging.copy_(v)
    up = staging.to("vnpu", non_blocking=True)
    if fix:
        torch.vnpu.current_stream().synchronize()
    staging.copy_(values())  # the next batch
    return torch.tensor(up.double().sum().item(), dtype=torch.float64), v.double().sum()


def free_race_as_last_vnpu_call(fix: bool):
    """A free without record_stream and then no vnpu call at all: its report comes at exit (stderr, exit
    status 1). Fix: record_stream."""
    _read_on_side_then_drop(fix)
    nothing = torch.zeros(1)
    return nothing, nothing


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


def graph_pinned_staging_rewritten(fix: bool):
    """A captured non_blocking upload from a pinned staging buffer: each replay reads the buffer when it runs, so
    refilling it for the next batch while the previous replay is still queued feeds that replay the wrong batch.
    Fix: wait for the replay (synchronize, or an event) before refilling the buffer."""
    staging = torch.empty(N, pin_memory=True)
    static_x = torch.empty(N, device="vnpu")
    g = torch.vnpu.VNPUGraph()
    with torch.vnpu.graph(g):
        static_x.copy_(staging, non_blocking=True)
        static_y = static_x * 2
    got, expected = [], []
    for _ in range(3):
        v = values()
        staging.copy_(v)  # without the fix: the previous replay may not have read the buffer yet
        torch.vnpu._sleep(BUSY_NS // 5)
        g.replay()
        got.append(static_y.clone())
        expected.append(v * 2)
        if fix:
            torch.vnpu.current_stream().synchronize()
    return torch.cat(got).cpu(), torch.cat(expected)


def caught_race_then_free_race_at_exit(fix: bool):
    """A race the program catches and handles, then an independent free without record_stream as the last vnpu
    work (found by the fourth break test: the caught error made the exit report skip the second). Fix: record it."""
    main, side = torch.vnpu.current_stream(), torch.vnpu.Stream()
    x = torch.arange(N, dtype=torch.float32, device="vnpu")
    torch.vnpu._sleep(BUSY_NS // 5)
    y = x * 2
    with torch.vnpu.stream(side):
        try:
            z = y + 1  # the first bug, caught
        except torch.vnpu.sanitizer.StreamRaceError:
            pass
    torch.vnpu.synchronize()
    out, expected = _read_on_side_then_drop(fix)
    return out.cpu() if fix else torch.zeros(0), expected if fix else torch.zeros(0)


def caught_free_race_then_same_memory_free_race_at_exit(fix: bool):
    """A free race caught at the next call, then a new tensor at the same address with its own free race as
    the last vnpu work (found by the fifth break test: skipped at exit as if it were the first one's
    consequence). Fix: record_stream for the second."""
    side = torch.vnpu.Stream()
    x = torch.ones(N, device="vnpu")
    side.wait_stream(torch.vnpu.current_stream())
    with torch.vnpu.stream(side):
        x * 2
    del x
    try:
        torch.vnpu.synchronize()
    except torch.vnpu.sanitizer.StreamRaceError:
        pass
    z = torch.ones(N, device="vnpu")
    side.wait_stream(torch.vnpu.current_stream())
    with torch.vnpu.stream(side):
        torch.vnpu._sleep(BUSY_NS // 5)
        z * 2
    if fix:
        z.record_stream(side)
    del z
    return torch.zeros(0), torch.zeros(0)


def blocking_upload_read_on_side_stream(fix: bool):
    """A correct CUDA program: a blocking upload while the default stream is busy, read on a side stream with
    no other ordering (CUDA's copy_ synchronizes the stream). Found by the fifth break test: vnpu returned with
    the copy still queued, and the side stream read the tensor before it was written."""
    torch.vnpu._sleep(BUSY_NS)
    v = values()
    w = v.to("vnpu")  # non_blocking=False
    side = torch.vnpu.Stream()
    with torch.vnpu.stream(side):
        y = w * 2
    side.synchronize()
    return y.cpu(), v * 2


def allocated_on_one_stream_written_on_another(fix: bool):
    """A block freed on the default stream (legally) and handed to a new tensor there, written by a side stream
    that did not wait for the default stream's queued work on the same memory. Fix: wait_stream."""
    main, side = torch.vnpu.current_stream(), torch.vnpu.Stream()
    torch.vnpu._sleep(BUSY_NS)
    a = torch.full((N,), 5.0, device="vnpu")  # queued behind the sleep
    del a
    b = torch.empty(N, device="vnpu")  # the same block, stream-ordered on the default stream
    if fix:
        side.wait_stream(main)
    with torch.vnpu.stream(side):
        b.fill_(1.0)
    main.wait_stream(side)
    return b.cpu(), torch.ones(N)


CASES = {f.__name__: f for f in (free_without_record_stream, free_without_record_stream_no_reuse,
                                 free_race_reader_result, record_stream_on_the_wrong_stream,
                                 strided_slices_from_two_streams,
                                 column_blocks_from_two_streams, missing_wait_stream, host_op_reads_side_stream,
                                 use_after_free, nonblocking_copy_read_early, pinned_staging_rewritten,
                                 pinned_staging_rewritten_then_item, free_race_as_last_vnpu_call, race_caught_then_retried,
                                 copy_reads_side_stream_output, poll_pinned_destination,
                                 nonblocking_copy_other_stream_synced, pinned_round_trip,
                                 pinned_upload_then_download_same_buffer,
                                 graph_replay_race, graph_pinned_staging_rewritten,
                                 caught_race_then_free_race_at_exit, allocated_on_one_stream_written_on_another,
                                 caught_free_race_then_same_memory_free_race_at_exit,
                                 blocking_upload_read_on_side_stream)}


def main() -> None:
    case, fix = sys.argv[1], sys.argv[2] == "1"
    try:
        got, expected = CASES[case](fix)
        print(json.dumps({"ok": float((got - expected).abs().max())}))
    except Exception as e:  # noqa: BLE001 - reported to the test
        print(json.dumps({"error": type(e).__name__, "message": str(e)}))


if __name__ == "__main__":
    main()
