"""torch.save of vnpu tensors with the storages downloaded ahead into pinned buffers
(torch_vnpu.checkpoints.torch_save). Oracle: the file torch.save writes through torch's own per-storage copy
(byte for byte), and the tensors' values on the CPU."""

import io

import pytest
import torch
import torch.storage

from torch_vnpu.checkpoints import torch_save

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.bool,
          torch.float8_e4m3fn, torch.complex64]


def _state():
    g = torch.Generator().manual_seed(0)
    out = {}
    for i, dtype in enumerate(DTYPES):
        for j, shape in enumerate(((), (0, 3), (7,), (33, 5), (300, 129))):
            x = torch.randn(shape, generator=g, dtype=torch.float64) * 50
            out[f"t{i}_{j}"] = (x > 0 if dtype == torch.bool else x).to(dtype)
    return out


def _on_vnpu(state):
    out = {k: v.to("vnpu") for k, v in state.items()}
    base = torch.arange(1000, dtype=torch.float32, device="vnpu")
    out["view_a"], out["view_b"] = base[10:20], base[510:].view(10, 49)  # one storage, saved once, larger than both
    out["other_device"] = torch.arange(64, dtype=torch.int32, device="vnpu:1")
    out["cpu"] = torch.ones(3)
    out["param"] = torch.nn.Parameter(torch.randn(4, 4, device="vnpu"))
    return out


def _torch_own_save(obj) -> bytes:
    """torch.save through torch's own copy per storage (the patch's wrapped functions)."""
    cpu = torch.storage._StorageBase.cpu
    try:
        torch.storage._StorageBase.cpu = cpu.__wrapped__
        buf = io.BytesIO()
        torch.save.__wrapped__(obj, buf)
        return buf.getvalue()
    finally:
        torch.storage._StorageBase.cpu = cpu


@pytest.mark.parametrize("window", [torch_save.WINDOW_BYTES, 100_000, 1024])
def test_the_file_is_byte_for_byte_torch_s_own(window, monkeypatch):
    monkeypatch.setattr(torch_save, "WINDOW_BYTES", window)
    obj = _on_vnpu(_state())
    downloaded = []
    take = torch_save.take

    def counting_take(storage, storages):
        got = take(storage, storages)
        downloaded.append(got is not None and got.nbytes())
        return got

    monkeypatch.setattr(torch_save, "take", counting_take)
    buf = io.BytesIO()
    torch.save(obj, buf)
    # every vnpu storage with bytes up to the window came from the downloads (the two views share one storage);
    # larger ones kept torch's copy
    sizes = {(v.device, v.untyped_storage().data_ptr()): v.untyped_storage().nbytes()
             for v in obj.values() if v.device.type == "vnpu" and v.numel()}
    assert len(sizes) == sum(1 for v in obj.values() if v.device.type == "vnpu" and v.numel()) - 1
    assert sum(1 for s in downloaded if s) == sum(1 for n in sizes.values() if n <= window) > 0
    assert buf.getvalue() == _torch_own_save(obj)
    back = torch.load(io.BytesIO(buf.getvalue()), map_location="cpu")
    for k, v in obj.items():
        assert torch.equal(back[k], v.detach().cpu()), k
    assert back["view_a"].untyped_storage().data_ptr() == back["view_b"].untyped_storage().data_ptr()


def test_the_file_holds_the_values_as_of_the_call():
    x = torch.zeros(512, 512, dtype=torch.int64, device="vnpu")
    y = torch.arange(512 * 512, device="vnpu").view(512, 512)
    for _ in range(100):  # the stream is still busy when the write of x is queued and torch.save is called
        y = y * 3 % 1000003
    x.copy_(y)
    buf = io.BytesIO()
    torch.save({"x": x}, buf)
    x.add_(1)  # after the call: not in the file
    assert torch.equal(torch.load(io.BytesIO(buf.getvalue()), map_location="cpu")["x"], (x - 1).cpu())


def test_a_failed_save_leaves_no_downloads_behind():
    class Full(io.RawIOBase):
        def writable(self):
            return True

        def write(self, b):
            raise OSError(28, "No space left on device")

    obj = _on_vnpu(_state())
    with pytest.raises(Exception, match="No space left|failed"):
        torch.save(obj, Full())
    assert torch_save._tls.stack == []
    buf = io.BytesIO()
    torch.save(obj, buf)  # the next save works
    assert buf.getvalue() == _torch_own_save(obj)


def test_cpu_calls_outside_torch_save_are_torch_s_own():
    x = torch.arange(10, device="vnpu")
    s = x.untyped_storage().cpu()
    assert s.device.type == "cpu" and not s.is_pinned()
    assert torch.equal(torch.empty(0, dtype=torch.int64).set_(s), torch.arange(10))


def test_saving_while_capturing_raises_the_capture_error_and_saves_nothing():
    """A host read inside a graph capture is refused, as on CUDA: the same error as torch's own copy."""
    x = torch.arange(1000.0, device="vnpu")
    torch.save({"warm": x}, io.BytesIO())  # pinned buffers cached: the capture would not refuse their allocation
    buf = io.BytesIO()
    with pytest.raises(torch.AcceleratorError, match="pageable host memory"):
        with torch.vnpu.graph(torch.vnpu.VNPUGraph()):
            y = x * 2
            torch.save({"y": y}, buf)
    assert torch_save._tls.stack == []
    torch.vnpu.synchronize()
    assert torch.equal((x * 2).cpu(), torch.arange(1000.0) * 2)
