"""torch.load onto vnpu reads the file into device memory (torch_vnpu.checkpoints.torch_load).

``torch.load(path, map_location="vnpu")`` builds every storage in host memory and copies it to the device with a
blocking copy per storage. For a path to a torch.save zip file and a vnpu ``map_location`` (a string or a
torch.device) the storages are read from the file into pinned buffers and uploaded as each fills; every other call
(file objects, legacy files, CPU or dict/function map_locations) is torch.load's own.
"""

from __future__ import annotations

import functools

from . import replace


def install() -> None:
    import torch

    original = torch.load
    if getattr(original, "_vnpu_streamed", False):
        return

    @functools.wraps(original)
    def load(f, map_location=None, *args, **kwargs):
        from ..checkpoints import torch_load

        if not args and torch_load.streams(f, map_location):
            return torch_load.load(f, map_location, **kwargs)
        return original(f, map_location, *args, **kwargs)

    load._vnpu_streamed = True
    replace(torch, "load", load, "serialization.load-streamed")
