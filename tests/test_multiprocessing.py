"""torch.multiprocessing with vnpu tensors (src/torch_vnpu/_multiprocessing_reductions.py): sent tensors share device memory
with the sender, as CUDA tensors do. Child functions live in tests/mp_share_child.py (spawn imports them)."""

import os
import subprocess
import sys
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mp_share_child  # noqa: E402

TIMEOUT = 90  # seconds for any answer of a child (spawn + import torch take ~5-10 s here)


def _answer(queue):
    status, value = queue.get(timeout=TIMEOUT)
    assert status == "ok", value
    return value


def _stop(proc):
    proc.join(timeout=TIMEOUT)
    if proc.is_alive():
        proc.kill()
        proc.join()
        pytest.fail("child did not exit")
    assert proc.exitcode == 0


def test_vnpu_tensors_sent_to_a_spawned_process_share_device_memory():
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=mp_share_child.receive_check_write, args=(inbox, outbox), daemon=True)
    proc.start()
    try:
        x = torch.arange(24, dtype=torch.float32, device="vnpu").reshape(4, 6)
        view = x[1:, ::2]  # storage offset 6, strides (6, 2)
        param = torch.nn.Parameter(torch.full((3,), 2.5, device="vnpu"))
        empty = torch.empty(0, 5, device="vnpu")
        storage = torch.tensor([1, 2, 3], dtype=torch.uint8, device="vnpu").untyped_storage()
        expected = torch.arange(24, dtype=torch.float32).reshape(4, 6)
        expected[0] = -7
        torch.vnpu._sleep(50_000_000)  # 50 ms of queued work before the write the receiver must see
        x[0].fill_(-7)
        inbox.put((x, view, param, empty, storage))  # no synchronize here: pickling waits for the device

        seen = _answer(outbox)
        assert seen["devices"] == ["vnpu:0"] * 5
        torch.testing.assert_close(seen["x"], expected, rtol=0, atol=0)
        torch.testing.assert_close(seen["view"], expected[1:, ::2], rtol=0, atol=0)
        assert seen["same_storage"] and seen["view_offset"] == 6 and seen["view_stride"] == (6, 2)
        assert seen["param_type"] == "Parameter" and seen["requires_grad"]
        torch.testing.assert_close(seen["param"], torch.full((3,), 2.5), rtol=0, atol=0)
        assert seen["empty_shape"] == (0, 5) and seen["storage_bytes"] == b"\x01\x02\x03"

        # the child's in-place writes (x += 100, then its view *= -1) are in this process's tensor
        after = expected + 100
        after[1:, ::2] *= -1
        torch.testing.assert_close(seen["x_after"], after, rtol=0, atol=0)
        torch.testing.assert_close(x.cpu(), after, rtol=0, atol=0)
        torch.testing.assert_close(view.cpu(), after[1:, ::2], rtol=0, atol=0)
        inbox.put("done")
        _stop(proc)
    finally:
        if proc.is_alive():
            proc.kill()


def test_vnpu_tensor_sent_by_a_child_arrives_on_vnpu():
    ctx = mp.get_context("spawn")
    outbox, release = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=mp_share_child.send_back, args=(outbox, release), daemon=True)
    proc.start()
    try:
        t = _answer(outbox)  # the child keeps its tensor alive until released (CUDA's rule too)
        assert t.device == torch.device("vnpu", 0) and t.dtype == torch.bfloat16 and t.shape == (3, 4)
        torch.testing.assert_close(t.cpu(), torch.arange(12, dtype=torch.bfloat16).reshape(3, 4) * 2, rtol=0, atol=0)
        torch.testing.assert_close((t + 1).sum().cpu(), torch.tensor(144.0, dtype=torch.bfloat16))  # usable by ops
        del t
        release.put(None)
        _stop(proc)
    finally:
        if proc.is_alive():
            proc.kill()


def test_sent_memory_is_kept_until_the_receiver_releases_it():
    """The sender drops its tensor at once: its memory is not reused while the receiver holds the tensor, and is
    freed by the sender's ipc_collect() after the receiver released it (CUDA's reference counting)."""
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=mp_share_child.receive_hold_release, args=(inbox, outbox), daemon=True)
    proc.start()
    try:
        torch.vnpu.ipc_collect()
        x = torch.full((4096,), 3.0, device="vnpu")  # 16 KiB
        ptr = x.data_ptr()
        inbox.put(x)
        del x  # the queue holds it until pickled; afterwards only the sent-slot reference does
        torch.testing.assert_close(_answer(outbox), torch.full((4096,), 3.0), rtol=0, atol=0)
        assert torch.vnpu.ipc_collect() == 0  # the receiver still holds it
        ys = [torch.full((4096,), 9.0, device="vnpu") for _ in range(4)]  # same size: a free block would be reused
        assert ptr not in {y.data_ptr() for y in ys}
        inbox.put("check")
        torch.testing.assert_close(_answer(outbox), torch.full((4096,), 3.0), rtol=0, atol=0)
        allocated = torch.vnpu.memory_allocated()
        inbox.put("release")
        assert _answer(outbox) == "released"
        assert torch.vnpu.ipc_collect() == 1
        assert torch.vnpu.memory_allocated() == allocated - 4096 * 4  # the sent block went back to the allocator
        inbox.put("exit")
        _stop(proc)
    finally:
        if proc.is_alive():
            proc.kill()


def test_same_process_round_trip_shares_the_storage():
    x = torch.randn(5, 3, device="vnpu")
    y = ForkingPickler.loads(ForkingPickler.dumps(x[1:]))
    assert y.device == x.device and y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    y.zero_()
    assert x[1:].abs().sum().item() == 0 and x[0].abs().sum().item() > 0
    # CPU tensors keep torch's own sharing
    c = ForkingPickler.loads(ForkingPickler.dumps(torch.ones(3)))
    assert c.device.type == "cpu" and c.tolist() == [1.0, 1.0, 1.0]


def test_non_leaf_requiring_grad_is_refused_as_for_other_devices():
    w = torch.ones(3, device="vnpu", requires_grad=True)
    with pytest.raises(RuntimeError, match="Cowardly refusing to serialize non-leaf tensor"):
        ForkingPickler.dumps(w * 2)


@pytest.mark.parametrize("env", [{"VNPU_IPC": "0"}, {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}])
def test_unshareable_device_memory_raises(env):
    """Private device memory (VNPU_IPC=0) or expandable segments: pickling for another process raises a
    RuntimeError that names the setting and what to do, and the process stays usable."""
    code = ("import torch; from multiprocessing.reduction import ForkingPickler\n"
            "try:\n    ForkingPickler.dumps(torch.ones(2, device='vnpu'))\n"
            "except RuntimeError as e:\n    print('RuntimeError:', e)\n"
            "print('after:', (torch.ones(2, device='vnpu') * 3).tolist())\n")
    clean = {k: v for k, v in os.environ.items() if k not in ("VNPU_IPC", "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT,
                          env={**clean, **env}, cwd=os.path.dirname(os.path.abspath(__file__)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RuntimeError: cannot share a vnpu:0 tensor with another process" in proc.stdout, proc.stdout
    assert "VNPU_IPC=0" in proc.stdout and "expandable_segments" in proc.stdout and "tensor.cpu()" in proc.stdout
    assert "after: [3.0, 3.0]" in proc.stdout
