"""torch.distributed.checkpoint loads read vnpu tensors from the files into the device
(torch_vnpu.checkpoints.dcp).

``FileSystemReader.read_data`` builds every tensor in host memory (``torch.load`` of its record) and copies it
into its target. Once ``torch.distributed.checkpoint.filesystem`` is imported, its local-file reader reads the
items whose target is a vnpu tensor from the file into that tensor; every other item, and readers of other file
systems, are DCP's own.
"""

from __future__ import annotations

import functools

from . import replace

_MODULE = "torch.distributed.checkpoint.filesystem"


def _patch(module) -> None:
    cls = module.FileSystemReader
    original = cls.read_data
    if getattr(original, "_vnpu_reads", False):
        return

    @functools.wraps(original)
    def read_data(self, plan, planner):
        if type(self.fs) is not module.FileSystem:  # fsspec and other file systems: DCP's own
            return original(self, plan, planner)
        from ..checkpoints import dcp

        return dcp.read_data(self, plan, planner, original)

    read_data._vnpu_reads = True
    replace(cls, "read_data", read_data, "distributed-checkpoint.read-into-device")


def install() -> None:
    from .._import_hooks import when_imported

    when_imported(_MODULE, _patch)
