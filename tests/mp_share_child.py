"""Child-process functions for tests/test_multiprocessing.py (an importable module: spawn pickles them by name)."""

import torch


def receive_check_write(inbox, outbox):
    """Gets (tensors...) from inbox, reports what it saw (CPU copies, devices, sharing), writes into them in place."""
    try:
        x, view, param, empty, storage = inbox.get(timeout=60)
        seen = {
            "x": x.cpu(), "view": view.cpu(), "param": param.detach().cpu(),
            "devices": [str(t.device) for t in (x, view, param, empty)] + [str(storage.device)],
            "param_type": type(param).__name__, "requires_grad": param.requires_grad,
            "same_storage": x.untyped_storage().data_ptr() == view.untyped_storage().data_ptr(),
            "view_offset": view.storage_offset(), "view_stride": view.stride(), "empty_shape": tuple(empty.shape),
            "storage_bytes": bytes(storage.cpu()),
        }
        x.add_(100)  # seen by the sender: same device memory
        view.mul_(-1)  # and by x here (a view of x's storage)
        seen["x_after"] = x.cpu()
        torch.vnpu.synchronize()
        outbox.put(("ok", seen))
        inbox.get(timeout=60)  # the sender has read the writes
    except BaseException as e:  # noqa: BLE001  (reported to the test)
        import traceback

        outbox.put(("error", traceback.format_exc()))


def send_back(outbox, release):
    """Makes a tensor on vnpu, sends it, keeps it alive until told to exit."""
    try:
        t = torch.arange(12, dtype=torch.bfloat16, device="vnpu").reshape(3, 4) * 2
        outbox.put(("ok", t))
        release.get(timeout=60)
    except BaseException:  # noqa: BLE001
        import traceback

        outbox.put(("error", traceback.format_exc()))


def receive_hold_release(inbox, outbox):
    """Gets a tensor, reports its values, reports them again when asked, then releases it when told."""
    try:
        t = inbox.get(timeout=60)
        outbox.put(("ok", t.cpu()))
        assert inbox.get(timeout=60) == "check"
        outbox.put(("ok", t.cpu()))  # after the sender dropped its tensor and allocated more
        assert inbox.get(timeout=60) == "release"
        del t
        import gc

        gc.collect()
        outbox.put(("ok", "released"))
        inbox.get(timeout=60)
    except BaseException:  # noqa: BLE001
        import traceback

        outbox.put(("error", traceback.format_exc()))
