"""Kernel errors are asynchronous and sticky per device: raised at the next synchronisation (or at the
failing call with VNPU_LAUNCH_BLOCKING=1), naming the op and the device; the device stays usable."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

DEV = "vnpu"


def _bad_index_select(device="vnpu:0"):
    x = torch.randn(5, 3, device=device)
    idx = torch.tensor([0, 7], device=device)  # 7 is out of range for dim 0 of size 5
    return torch.index_select(x, 0, idx)


def _assert_kernel_error(exc, device="vnpu:0"):
    assert isinstance(exc, torch.AcceleratorError), type(exc)  # as CUDA's asynchronous errors (a RuntimeError)
    msg = str(exc)
    assert "index_select" in msg, msg
    assert device in msg, msg
    assert "index out of range" in msg, msg


def _assert_device_usable(device="vnpu:0"):
    torch.vnpu.synchronize(device)  # nothing pending any more
    a = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    d = a.to(device)
    out = (d @ d.t() + 1).sum(0)
    assert torch.equal(out.cpu(), (a @ a.t() + 1).sum(0))
    assert torch.equal(torch.index_select(d, 0, torch.tensor([2, 0], device=device)).cpu(), a[[2, 0]])


def test_error_raised_at_synchronize_not_at_call():
    y = _bad_index_select()  # must return (the kernel runs later on the stream worker)
    assert y.shape == (2, 3) and y.device == torch.device("vnpu:0")
    with pytest.raises(RuntimeError) as ei:
        torch.vnpu.synchronize()
    _assert_kernel_error(ei.value)
    _assert_device_usable()


@pytest.mark.parametrize("sync", ["cpu", "item", "tolist", "stream_sync", "event_sync"])
def test_error_raised_at_other_synchronising_calls(sync):
    y = _bad_index_select()
    with pytest.raises(RuntimeError) as ei:
        if sync == "cpu":
            y.cpu()
        elif sync == "item":
            y.sum().item()
        elif sync == "tolist":
            y.tolist()
        elif sync == "stream_sync":
            torch.vnpu.current_stream().synchronize()
        else:
            e = torch.vnpu.Event()
            e.record()
            e.synchronize()
    _assert_kernel_error(ei.value)
    _assert_device_usable()


def test_error_is_reported_once():
    _bad_index_select()
    with pytest.raises(RuntimeError):
        torch.vnpu.synchronize()
    torch.vnpu.synchronize()  # the error has been consumed: must not raise again
    _assert_device_usable()


def test_work_queued_after_failure_then_device_recovers():
    y = _bad_index_select()
    z = (y * 2).sum()  # depends on the failed kernel; queued before the error is seen
    with pytest.raises(RuntimeError) as ei:
        z.item()
    _assert_kernel_error(ei.value)
    _assert_device_usable()
    # Tensors created before the failure keep their values.
    keep_cpu = torch.randn(10)
    keep = keep_cpu.to(DEV)
    _bad_index_select()
    with pytest.raises(RuntimeError):
        torch.vnpu.synchronize()
    assert torch.equal(keep.cpu(), keep_cpu)


def test_error_on_second_device_is_per_device():
    _bad_index_select("vnpu:1")
    torch.vnpu.synchronize(0)  # device 0 has no error
    assert torch.equal((torch.ones(3, device="vnpu:0") * 2).cpu(), torch.full((3,), 2.0))
    with pytest.raises(RuntimeError) as ei:
        torch.vnpu.synchronize(1)
    _assert_kernel_error(ei.value, "vnpu:1")
    _assert_device_usable("vnpu:1")


def test_error_on_side_stream_surfaces_at_device_synchronize():
    s = torch.vnpu.Stream()
    x = torch.randn(5, 3, device=DEV)
    idx = torch.tensor([9], device=DEV)
    s.wait_stream(torch.vnpu.current_stream())
    with torch.vnpu.stream(s):
        torch.index_select(x, 0, idx)
    with pytest.raises(RuntimeError) as ei:
        torch.vnpu.synchronize()
    _assert_kernel_error(ei.value)
    _assert_device_usable()


_HOST_CHECKS = {
    "float_index": (RuntimeError, lambda x: torch.index_select(x, 0, torch.tensor([0.5], device=x.device))),
    "bad_dim": (IndexError, lambda x: torch.index_select(x, 2, torch.tensor([0], device=x.device))),
    "mm_shapes": (RuntimeError, lambda x: torch.mm(x, x)),
    "cat_shapes": (RuntimeError, lambda x: torch.cat([x, x.t()])),
}


@pytest.mark.parametrize("case", list(_HOST_CHECKS))
def test_host_side_argument_errors_are_synchronous(case):
    # Errors detectable from metadata (dtype/dim/shape checks) are raised at the call, as on CUDA and CPU.
    exc, fn = _HOST_CHECKS[case]
    with pytest.raises(exc):
        fn(torch.randn(5, 3))  # CPU oracle
    x = torch.randn(5, 3, device=DEV)
    try:
        with pytest.raises(exc):
            fn(x)
    finally:
        try:
            torch.vnpu.synchronize()  # drain a late report so the next test starts clean
        except RuntimeError:
            pass


_BLOCKING_SCRIPT = textwrap.dedent(r'''
    import torch
    x = torch.randn(5, 3, device="vnpu")
    idx = torch.tensor([0, 7], device="vnpu")
    where = None
    try:
        y = torch.index_select(x, 0, idx)
        where = "after call"
        torch.vnpu.synchronize()
        where = "after sync"
    except RuntimeError as e:
        print("RAISED_AT", where)
        print("MSG", str(e).splitlines()[0])
        print("HINT", "VNPU_LAUNCH_BLOCKING" in str(e))
    torch.vnpu.synchronize()
    print("USABLE", (torch.arange(4, device="vnpu") * 3).sum().item())
''')


def test_launch_blocking_raises_at_failing_call():
    env = dict(os.environ, VNPU_LAUNCH_BLOCKING="1")
    p = subprocess.run([sys.executable, "-c", _BLOCKING_SCRIPT], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout
    assert "RAISED_AT None" in out, out  # raised by the index_select call itself
    msg = [line for line in out.splitlines() if line.startswith("MSG")][0]
    assert "index_select" in msg and "vnpu:0" in msg, msg
    assert "HINT False" in out, out  # no "set VNPU_LAUNCH_BLOCKING=1" advice when it is set
    assert "USABLE 18" in out, out
