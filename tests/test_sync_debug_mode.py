"""torch.vnpu.set_sync_debug_mode: host waits reported as torch.cuda.set_sync_debug_mode reports them.

Oracle: CUDA's behaviour (c10/cuda warns or raises in memcpy_and_sync and stream_synchronize: blocking copies,
.item(), Stream.synchronize(), ops whose output depends on the data; not in torch.cuda.synchronize() or
Event.synchronize()) and CPU's values for the results of the operations that were allowed to run.
"""
import gc
import threading
import warnings

import pytest
import torch

PREFIX = "called a synchronizing vnpu operation"


@pytest.fixture(autouse=True)
def _mode_restored():
    yield
    torch.vnpu.set_sync_debug_mode(0)
    gc.collect()  # pytest.raises' traceback keeps the test's tensors in a cycle until collected


def reports(fn):
    """(the sync warnings fn issued, fn's result)."""
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = fn()
    return [str(w.message) for w in rec if PREFIX in str(w.message)], out


x_cpu = torch.randn(5, 6, generator=torch.Generator().manual_seed(0))

# (name, operation on x) that wait for the device on CUDA too, and the text the report names.
WAITING = [
    ("item", lambda x: x[0, 0].item(), "_local_scalar_dense"),
    ("bool", lambda x: bool(x.sum() > 0), "_local_scalar_dense"),
    ("cpu", lambda x: x.cpu(), "blocking copy to the host"),
    ("tolist", lambda x: x.tolist(), "blocking copy to the host"),
    ("to_cpu_pinned_blocking", lambda x: torch.empty(5, 6).pin_memory().copy_(x), "blocking copy to the host"),
    ("upload", lambda x: torch.tensor([1.0, 2.0], device=x.device), "blocking copy to vnpu"),
    ("copy_from_cpu", lambda x: x.clone().copy_(x_cpu), "blocking copy to vnpu"),
    ("nonzero", lambda x: x.nonzero(), "aten::nonzero"),
    ("bool_mask", lambda x: x[x > 0], "aten::index"),
    ("masked_select", lambda x: torch.masked_select(x, x > 0), "aten::masked_select"),
    ("stream_synchronize", lambda x: torch.vnpu.current_stream().synchronize(), "Stream.synchronize()"),
]

# Operations that do not wait for the device (or wait because the program asked for it).
NOT_WAITING = [
    ("add", lambda x: x + 1),
    ("matmul_sum", lambda x: (x @ x.T).sum()),
    ("to_cpu_non_blocking_pinned", lambda x: x.to("cpu", non_blocking=True)),
    ("upload_non_blocking_pinned", lambda x: torch.ones(3).pin_memory().to(x.device, non_blocking=True)),
    ("synchronize", lambda x: torch.vnpu.synchronize()),
    ("event_synchronize", lambda x: torch.vnpu.current_stream().record_event().synchronize()),
    ("masked_fill", lambda x: x.masked_fill(x > 0, 0.0)),
]


def test_default_mode_and_settings_mirror_torch_cuda():
    assert torch.vnpu.get_sync_debug_mode() == 0
    import numpy as np

    for value, expected in (("warn", 1), ("error", 2), ("default", 0), (1, 1), (2, 2), (np.int64(0), 0)):
        torch.vnpu.set_sync_debug_mode(value)
        assert torch.vnpu.get_sync_debug_mode() == expected
    torch.vnpu.set_sync_debug_mode("warn")
    with pytest.raises(RuntimeError, match="expected one of `default`, `warn`, `error`"):
        torch.vnpu.set_sync_debug_mode("loud")
    with pytest.raises(RuntimeError, match="expected one of 0,1,2"):
        torch.vnpu.set_sync_debug_mode(3)
    for bad in (1.0, True, None):
        with pytest.raises(RuntimeError, match="invalid argument to set_sync_debug_mode"):
            torch.vnpu.set_sync_debug_mode(bad)
    assert torch.vnpu.get_sync_debug_mode() == 1  # a refused value leaves the mode as it was


@pytest.mark.parametrize("name,op,what", WAITING, ids=[w[0] for w in WAITING])
def test_warn_reports_each_wait_once_and_the_values_stay_cpus(name, op, what):
    x = x_cpu.to("vnpu")
    expected = op(x_cpu) if name not in ("stream_synchronize", "upload") else None
    torch.vnpu.synchronize()
    torch.vnpu.set_sync_debug_mode("warn")
    got, out = reports(lambda: op(x))
    torch.vnpu.set_sync_debug_mode(0)
    assert len(got) == 1, got
    assert what in got[0], got
    if expected is not None:
        out = out.cpu() if isinstance(out, torch.Tensor) else out
        assert out == expected if not isinstance(out, torch.Tensor) else torch.equal(out, expected)


@pytest.mark.parametrize("name,op", NOT_WAITING, ids=[w[0] for w in NOT_WAITING])
def test_operations_that_do_not_wait_are_not_reported_in_error_mode(name, op):
    x = x_cpu.to("vnpu")
    torch.vnpu.synchronize()
    torch.vnpu.set_sync_debug_mode("error")
    got, out = reports(lambda: op(x))
    torch.vnpu.set_sync_debug_mode(0)
    assert got == []
    if name in ("add", "matmul_sum", "masked_fill"):
        assert torch.equal(out.cpu(), op(x_cpu))


@pytest.mark.parametrize("name,op,what", WAITING, ids=[w[0] for w in WAITING])
def test_error_raises_before_waiting_and_loses_nothing(name, op, what):
    x = x_cpu.to("vnpu")
    y = torch.exp(x)  # queued work of the stream, intact after the refusal
    torch.vnpu.set_sync_debug_mode("error")
    with pytest.raises(RuntimeError, match=PREFIX) as info:
        op(x)
    assert what in str(info.value) and "set_sync_debug_mode" in str(info.value)
    torch.vnpu.set_sync_debug_mode("default")
    assert torch.equal(y.cpu(), torch.exp(x_cpu))
    assert torch.equal(x.cpu(), x_cpu)


def test_waits_only_vnpu_makes_warn_in_warn_mode_only_and_compute_cpus_value():
    e = torch.empty(0, 3, device="vnpu")  # an empty input runs synchronously on vnpu, not on CUDA
    torch.vnpu.set_sync_debug_mode("warn")
    got, out = reports(lambda: e.sum(0))
    assert len(got) == 1 and "CUDA would not wait here" in got[0], got
    assert torch.equal(out.cpu(), torch.empty(0, 3).sum(0))
    torch.vnpu.set_sync_debug_mode("error")  # code clean under CUDA's "error" runs, warnings as errors too
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = e.sum(0)
    torch.vnpu.set_sync_debug_mode(0)
    assert torch.equal(out.cpu(), torch.empty(0, 3).sum(0))


def test_the_mode_is_process_wide():
    x = x_cpu.to("vnpu")
    torch.vnpu.set_sync_debug_mode("error")
    seen = {}

    def other_thread():
        seen["mode"] = torch.vnpu.get_sync_debug_mode()
        try:
            x.sum().item()
        except RuntimeError as e:
            seen["error"] = str(e)

    t = threading.Thread(target=other_thread)
    t.start()
    t.join(timeout=60)
    assert seen["mode"] == 2 and PREFIX in seen.get("error", "")


def test_a_decode_loop_reports_its_per_token_host_read():
    """The tool's use: a greedy decode loop whose stop test reads the device each step is reported once per
    step at the line that reads; the values equal CPU's."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(50, 16)
    head = torch.nn.Linear(16, 50)

    def decode(e, h, steps=6):
        tok = torch.zeros(1, dtype=torch.long, device=h.weight.device)
        out = []
        for _ in range(steps):
            tok = h(e(tok)).argmax(-1)
            out.append(tok)
            if bool((tok == 49).all()):  # the host read a CUDA user would look for
                break
        return torch.cat(out)

    expected = decode(emb, head)
    e, h = emb.to("vnpu"), head.to("vnpu")
    decode(e, h)  # warm-up: first calls with new layouts
    torch.vnpu.set_sync_debug_mode("warn")
    got, out = reports(lambda: decode(e, h))
    torch.vnpu.set_sync_debug_mode(0)
    assert torch.equal(out.cpu(), expected)
    assert len(got) == len(expected) and all("_local_scalar_dense" in g for g in got), got
