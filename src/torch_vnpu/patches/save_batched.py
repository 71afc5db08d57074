"""torch.save of vnpu tensors downloads the storages ahead into pinned buffers (torch_vnpu.checkpoints.torch_save).

torch.save writes each storage right after a blocking ``storage.cpu()`` copy of it. While a torch.save runs on a
thread, a ``.cpu()`` of a vnpu storage called by torch.serialization's writer loop (``_save``) is answered from
downloads queued ahead; every other ``.cpu()`` call is torch's own.
"""

from __future__ import annotations

import functools
import sys

from . import replace


def install() -> None:
    import torch
    import torch.serialization
    import torch.storage

    original_save = torch.save
    if getattr(original_save, "_vnpu_batched", False):
        return
    original_cpu = torch.storage._StorageBase.cpu
    writer = torch.serialization._save.__code__

    @functools.wraps(original_save)
    def save(*args, **kwargs):
        from ..checkpoints import torch_save

        with torch_save.saving():
            return original_save(*args, **kwargs)

    @functools.wraps(original_cpu)
    def cpu(self):
        if self.device.type == "vnpu":
            caller = sys._getframe(1)
            if caller.f_code is writer:
                from ..checkpoints import torch_save

                storages = caller.f_locals.get("serialized_storages")
                got = torch_save.take(self, storages) if isinstance(storages, dict) else None
                if got is not None:
                    return got
        return original_cpu(self)

    save._vnpu_batched = True
    replace(torch, "save", save, "serialization.save-batched")
    replace(torch.storage._StorageBase, "cpu", cpu, "serialization.save-batched")
