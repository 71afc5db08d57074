"""Loading a safetensors file onto vnpu: read in chunks into pinned buffers, uploaded as each fills.

The file is validated by safetensors itself (same errors as a CPU load), tensors are allocated on the device, and
the data region is read with plain reads (not mmap) into a bounded ring of pinned buffers whose uploads are queued
on the current stream: host memory stays within ``slots x chunk_bytes`` beyond the result, and work queued on the
stream afterwards sees the bytes (the call returns once the last upload is queued).
"""

from __future__ import annotations

import json
import os
import struct

import torch

__all__ = ["load_file"]

_CHUNK_BYTES = 16 << 20
_SLOTS = 4


def _header(path: str) -> tuple[int, dict]:
    """(start of the data region, header entries); validated by safetensors (its SafetensorError on a bad file)."""
    from safetensors import safe_open

    with safe_open(path, framework="pt", device="cpu"):  # validates header, offsets and sizes
        pass
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return 8 + n, header


def load_file(path: str | os.PathLike, device: str | int | torch.device = "vnpu", *, dtype: torch.dtype | None = None,
              chunk_bytes: int = _CHUNK_BYTES, slots: int = _SLOTS) -> dict[str, torch.Tensor]:
    """Load a safetensors file onto a vnpu device, as ``safetensors.torch.load_file(path, device)``.

    Args:
        path: the ``.safetensors`` file.
        device: a vnpu device (``"vnpu"``, ``"vnpu:1"``, ``1``, ``torch.device("vnpu", 1)``).
        dtype: if given, floating-point tensors are converted to it on the device (other tensors keep theirs).
        chunk_bytes, slots: the staging ring (``slots`` pinned buffers of up to ``chunk_bytes`` bytes each).

    Returns:
        {name: tensor} with the file's shapes and dtypes (every dtype safetensors has; those safetensors.torch
        has no plain dtype for, such as packed float4, go through safetensors' own reader), on ``device``.

    Raises:
        safetensors.SafetensorError: a malformed file (header, offsets, sizes), as safetensors raises on CPU.
        RuntimeError: an I/O error, or the file got shorter while being read, naming the file and the tensor
            (a file already truncated is safetensors' SafetensorError). Nothing stays allocated: the tensors
            loaded so far are freed.
        torch.OutOfMemoryError: the checkpoint does not fit; the tensors allocated so far are freed.
        ValueError: ``device`` is not a vnpu device, or ``chunk_bytes`` / ``slots`` are not positive.
    """
    from safetensors.torch import _TYPES

    path = os.fspath(path)
    if not (isinstance(chunk_bytes, int) and isinstance(slots, int) and chunk_bytes > 0 and slots > 0):
        raise ValueError(f"chunk_bytes and slots must be positive integers, got {chunk_bytes!r} and {slots!r}")
    device = torch.device("vnpu", device) if isinstance(device, int) else torch.device(device)
    if device.type != "vnpu":
        raise ValueError(f"torch_vnpu.checkpoints.safetensors.load_file loads onto vnpu devices, got {device}")
    if device.index is None:
        device = torch.device("vnpu", torch.vnpu.current_device())
    start, header = _header(path)
    out: dict[str, torch.Tensor] = {}
    segments = []
    others = []  # dtypes only safetensors' own reader builds (packed float4, float8_e8m0, ...)
    with torch.vnpu.device(device):
        try:
            for name, entry in header.items():
                if entry["dtype"] not in _TYPES:
                    others.append(name)
                    continue
                begin, end = entry["data_offsets"]
                t = torch.empty(entry["shape"], dtype=_TYPES[entry["dtype"]], device=device)
                out[name] = t
                if end > begin:
                    segments.append((start + begin, end - begin, t.data_ptr(), name))
            t = None
            from .. import _C

            _C._read_into_device(path, segments, chunk_bytes, slots)
            if others:
                from safetensors import safe_open

                with safe_open(path, framework="pt", device="cpu") as f:
                    for name in others:
                        out[name] = f.get_tensor(name).to(device)
        except BaseException:
            # Nothing stays allocated (the traceback keeps this frame): the memory goes back to the allocator,
            # stream-ordered after the uploads already queued.
            out.clear()
            t = None
            raise
        if dtype is not None:
            out = {k: v.to(dtype) if v.is_floating_point() else v for k, v in out.items()}
    return out
