"""Programs for tests/test_sanitizer_host_access.py (VNPU_SANITIZE check 4: host access to device memory).

The porting bug: host code that dereferences a vnpu ``data_ptr()`` (here ctypes and numpy over the raw
pointer). vnpu memory is host memory, so it silently works (and reads the right bytes) on vnpu, while on a
real accelerator it crashes or reads garbage. Each ``bug_*`` function returns what it saw; the test runs
them in its own process (no sanitizer) and, as ``python host_access_cases.py violations``, with
VNPU_SANITIZE=1 in a fresh process (the sanitizer is per process). ``python host_access_cases.py clean``
runs ordinary programs (several streams, synchronous ops, non_blocking copies, graphs, torch.compile,
sparse ops) under the sanitizer and compares them with the CPU. Each run prints one JSON line.
"""

import ctypes
import json
import sys

import numpy as np
import torch

N = 4096


def host_view(t: torch.Tensor) -> np.ndarray:
    """The bug: a numpy array over a vnpu tensor's raw pointer (float32)."""
    buf = (ctypes.c_float * t.numel()).from_address(t.data_ptr())
    return np.ctypeslib.as_array(buf)


def _error_of(fn):
    """Runs fn (the next vnpu call after the bug); returns (error type name, message) or (None, None)."""
    try:
        fn()
    except RuntimeError as e:  # HostAccessError is a RuntimeError
        return type(e).__name__, str(e)
    return None, None


def bug_read() -> dict:
    x = torch.arange(N, dtype=torch.float32, device="vnpu") * 2
    other = torch.full((N,), 3.0, device="vnpu")
    torch.vnpu.synchronize()
    seen = host_view(x).copy()  # the read through data_ptr()
    error, message = _error_of(lambda: x + 1)
    return {
        "read_right_bytes": bool((seen == np.arange(N, dtype=np.float32) * 2).all()),
        "error": error,
        "message": message,
        "ptr": x.data_ptr(),
        "x_unchanged": torch.equal(x.cpu(), torch.arange(N, dtype=torch.float32) * 2),
        "other_unchanged": torch.equal(other.cpu(), torch.full((N,), 3.0)),
    }


def bug_write() -> dict:
    x = torch.zeros(N, device="vnpu")
    other = torch.full((N,), 3.0, device="vnpu")
    torch.vnpu.synchronize()
    ctypes.memmove(x.data_ptr() + 4 * 10, (ctypes.c_float * 1)(5.0), 4)  # the write through data_ptr()
    error, message = _error_of(torch.vnpu.synchronize)
    return {
        "error": error,
        "message": message,
        "written": float(x[10].item()),
        "rest_zero": bool((x.cpu()[11:] == 0).all()),
        "other_unchanged": torch.equal(other.cpu(), torch.full((N,), 3.0)),
    }


def bug_cpu_tensor_over_device_memory() -> dict:
    """A CPU tensor over a vnpu pointer (torch.frombuffer of a ctypes buffer, like torch.from_blob in C++), read
    by a CPU op: ATen's parallel kernels read on several host threads at once."""
    n = 1 << 20
    x = torch.ones(n, device="vnpu")
    torch.vnpu.synchronize()
    alias = torch.frombuffer((ctypes.c_float * n).from_address(x.data_ptr()), dtype=torch.float32)
    total = float(alias.sum())  # the read
    error, message = _error_of(lambda: x * 3)
    return {"total": total, "error": error, "message": message,
            "x_unchanged": torch.equal(x.cpu(), torch.ones(n))}


def bug_read_freed() -> dict:
    """A host view kept past its tensor: read after the tensor is freed, reported at the next vnpu call, which
    allocates the same memory to a new tensor first."""
    x = torch.arange(N, dtype=torch.float32, device="vnpu")
    torch.vnpu.synchronize()
    view, ptr = host_view(x), x.data_ptr()
    del x
    float(view[0])  # the read, of freed memory
    error, message = _error_of(lambda: torch.full((N,), 7.0, device="vnpu"))  # reuses the block, then launches
    y = torch.full((N,), 7.0, device="vnpu")
    return {"error": error, "message": message, "ptr": ptr, "reused": y.data_ptr() == ptr}


def fixed_read() -> dict:
    x = torch.arange(N, dtype=torch.float32, device="vnpu") * 2
    seen = x.cpu().numpy()  # the fix: copy to the host first
    error, message = _error_of(lambda: (x + 1, torch.vnpu.synchronize()))
    return {"read_right_bytes": bool((seen == np.arange(N, dtype=np.float32) * 2).all()), "error": error,
            "message": message}


def violations() -> dict:
    out = {"check_on": torch.vnpu.sanitizer.is_enabled() and torch_vnpu_check_on()}
    out["read"] = bug_read()
    out["read_again"] = bug_read()  # reported again: the report gave the memory its protection back
    out["write"] = bug_write()
    out["cpu_tensor"] = bug_cpu_tensor_over_device_memory()
    out["read_freed"] = bug_read_freed()
    out["fixed"] = fixed_read()
    return out


def torch_vnpu_check_on() -> bool:
    from torch_vnpu import _C

    return bool(_C._sanitizer_host_access_check()[0])


# --- ordinary programs: no report under the sanitizer, equal to the CPU -----------------------------------


def sync_ops(device: str) -> list:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1 << 20, generator=g).to(device)  # large enough for ATen's parallel kernels
    mask = x > 0.5
    return [
        torch.nonzero(mask).cpu(),
        torch.masked_select(x, mask).cpu(),
        x[mask].cpu(),
        torch.unique((x * 4).round()).cpu(),
        torch.tensor([x.sum().item(), float(x.max())]),
        torch.tensor(x[:5].tolist()),
    ]


def train(device: str) -> list:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 10)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)) for _ in range(3)]
    losses = []
    side = torch.vnpu.Stream() if device == "vnpu" else None
    for xb, yb in batches:
        if side is not None:  # inputs copied on a side stream, pinned and non_blocking
            with torch.vnpu.stream(side):
                xd = xb.pin_memory().to(device, non_blocking=True)
                yd = yb.pin_memory().to(device, non_blocking=True)
            torch.vnpu.current_stream().wait_stream(side)
            xd.record_stream(torch.vnpu.current_stream())
            yd.record_stream(torch.vnpu.current_stream())
        else:
            xd, yd = xb, yb
        loss = torch.nn.functional.cross_entropy(model(xd), yd)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach().cpu().reshape(1))
    host = torch.empty(10, 128, pin_memory=True) if device == "vnpu" else torch.empty(10, 128)
    host.copy_(model[2].weight, non_blocking=True)
    if device == "vnpu":
        torch.vnpu.synchronize()
    return losses + [host.clone()]


def graph_replay() -> list:
    lin = torch.nn.Linear(16, 16).to("vnpu")
    static_x = torch.zeros(4, 16, device="vnpu")
    s = torch.vnpu.Stream()
    s.wait_stream(torch.vnpu.current_stream())
    with torch.no_grad(), torch.vnpu.stream(s):
        lin(static_x)
    torch.vnpu.current_stream().wait_stream(s)
    graph = torch.vnpu.VNPUGraph()
    with torch.no_grad(), torch.vnpu.graph(graph):
        static_y = torch.relu(lin(static_x)) * 2
    # Check 1 records captured tasks on the capture stream as if they ran there, so writing static_x on the
    # current stream after the capture is reported as a race with them (a known false positive of check 1,
    # docs/sanitizer.md); a host synchronization orders the capture stream first.
    torch.vnpu.synchronize()
    got, expected = [], []
    lin_cpu = torch.nn.Linear(16, 16)
    lin_cpu.load_state_dict({k: v.cpu() for k, v in lin.state_dict().items()})
    for i in range(3):
        x = torch.full((4, 16), float(i)) + torch.arange(16.0)
        static_x.copy_(x)
        graph.replay()
        got.append(static_y.cpu())
        with torch.no_grad():
            expected.append(torch.relu(lin_cpu(x)) * 2)
    return [got, expected]


def compiled() -> list:
    """torch.compile on vnpu (fused C++ kernels on the stream) against eager CPU."""

    def f(a, b):
        return torch.nn.functional.silu(a @ b + 1).sum(dim=0)

    a = torch.linspace(-2, 2, 64 * 32).reshape(64, 32)
    b = torch.linspace(1, -1, 32 * 16).reshape(32, 16)
    return [torch.compile(f)(a.to("vnpu"), b.to("vnpu")).cpu(), f(a, b)]


def sparse(device: str) -> torch.Tensor:
    i = torch.tensor([[0, 1, 1, 3], [2, 0, 2, 1]])
    v = torch.tensor([1.0, 2.0, 3.0, 4.0])
    s = torch.sparse_coo_tensor(i, v, (4, 3)).to(device)
    return (s + s).coalesce().to_dense().cpu()


def max_diff(a, b) -> float:
    if isinstance(a, (list, tuple)):
        return max(max_diff(x, y) for x, y in zip(a, b))
    if a.shape != b.shape:
        return float("inf")
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def clean() -> dict:
    out = {"check_on": torch.vnpu.sanitizer.is_enabled() and torch_vnpu_check_on()}
    torch.randn(1 << 21).sum()  # the host thread now has an OpenMP pool made without device access
    try:
        out["sync_ops"] = max_diff(sync_ops("vnpu"), sync_ops("cpu"))
        out["train"] = max_diff(train("vnpu"), train("cpu"))
        out["graph"] = max_diff(*graph_replay())
        out["sparse"] = max_diff(sparse("vnpu"), sparse("cpu"))
        out["compile"] = max_diff(*compiled())
        torch.vnpu.synchronize()
        from torch_vnpu import _C

        _C._sanitizer_check_host_access()  # nothing recorded since the last call either
    except Exception as e:  # noqa: BLE001 - reported to the test
        out["error"] = type(e).__name__
        out["message"] = str(e)
    return out


if __name__ == "__main__":
    print(json.dumps({"violations": violations, "clean": clean}.get(sys.argv[1], lambda: None)()))
