"""``torch.distributed.checkpoint.load`` onto vnpu: each rank reads its tensors' bytes from the checkpoint files
straight into the vnpu tensors they restore.

DCP's ``FileSystemReader.read_data`` restores a tensor by ``torch.load``-ing its record (a ``torch.save`` archive
inside a ``.distcp`` file) into host memory, narrowing it to the requested chunk and copying that into the target.
Here, when the chunk is one contiguous byte range of the record and the target is a contiguous vnpu tensor of the
same dtype, only the record's metadata is unpickled (``torch.load(map_location="meta")``, which also gives the
storage's offset in the record), and the range is read from the file into the target (Note [Checkpoint reads],
csrc/io): no host copy, reads in flight across the rank's tensors, stream-ordered on the current stream. Each rank
reads only the items of its own load plan, as with DCP's reader.

Everything else goes through DCP's own ``read_data``, unchanged: bytes items, CPU targets, chunks that are not
contiguous in the file (a resharded load that splits a saved tensor along a later dimension), dtype changes,
records with a stream transform (compression, extensions) or compressed zip entries, other byte orders, and
readers of other file systems.
"""

from __future__ import annotations

import dataclasses
import io
import os
from typing import Any, Callable

import torch

from ._archive import raw_bytes

__all__ = ["read_data"]

_CHUNK_BYTES = 16 << 20
_SLOTS = 4


class _Range(io.RawIOBase):
    """Bytes ``start .. start + length`` of an open file, as a seekable file (what zipfile needs)."""

    def __init__(self, fd: int, start: int, length: int) -> None:
        super().__init__()
        self.fd, self.start, self.length, self.pos = fd, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.length}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer: Any) -> int:
        n = max(0, min(len(buffer), self.length - self.pos))
        data = os.pread(self.fd, n, self.start + self.pos)
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)


def _plan_reads(reader: Any, plan: Any, planner: Any) -> tuple[dict, list]:
    """({(path, device index): [(request, target, file offset, bytes)]}, requests left to DCP's reader)."""
    from torch.distributed.checkpoint.filesystem import narrow_tensor_by_index
    from torch.distributed.checkpoint.planner import LoadItemType

    reads: dict[tuple[str, int], list] = {}
    rest = []
    streams: dict[str, Any] = {}
    try:
        for req in plan.items:
            info = reader.storage_data[req.storage_index]
            if req.type != LoadItemType.TENSOR or info.transform_descriptors:
                rest.append(req)
                continue
            target = planner.resolve_tensor(req).detach()
            if (target.device.type != "vnpu" or target.layout != torch.strided or not target.is_contiguous()
                    or target.is_conj() or target.is_neg()):
                rest.append(req)
                continue
            path = str(reader.fs.concat_path(reader.path, info.relative_path))
            if path not in streams:
                streams[path] = open(path, "rb")
            record = reader._slice_file(streams[path], info)
            try:
                saved = torch.serialization.load(record, map_location="meta", weights_only=True)
            except (RuntimeError, OSError, EOFError) as e:  # a truncated or overwritten file
                why = str(e) or f"{type(e).__name__}: the file ends at byte {os.path.getsize(path)}"
                raise RuntimeError(f"{path}: the record of tensor '{req.dest_index.fqn}' (bytes {info.offset}.."
                                   f"{info.offset + info.length}) cannot be read: {why}") from e
            if not isinstance(saved, torch.Tensor):
                rest.append(req)
                continue
            chunk = narrow_tensor_by_index(saved, req.storage_offsets, req.lengths)
            if (chunk.dtype != target.dtype or chunk.size() != target.size() or not chunk.is_contiguous()
                    or chunk.is_conj() or chunk.is_neg()):
                rest.append(req)
                continue
            if not raw_bytes(_Range(streams[path].fileno(), info.offset, info.length)):
                rest.append(req)
                continue
            size = chunk.element_size()
            offset = info.offset + saved.untyped_storage()._checkpoint_offset + chunk.storage_offset() * size
            reads.setdefault((path, target.device.index), []).append((req, target, offset, chunk.numel() * size))
    finally:
        for f in streams.values():
            f.close()
    return reads, rest


def read_data(reader: Any, plan: Any, planner: Any, original: Callable) -> torch.futures.Future:
    """``FileSystemReader.read_data(plan, planner)`` with vnpu targets read from the file into the device.

    Args:
        reader: the ``FileSystemReader`` (local files); ``plan``, ``planner``: as DCP passes them.
        original: DCP's own ``read_data``, for the items not read here.

    Returns:
        A completed future, as DCP's reader returns; every target holds its bytes for work queued afterwards on
        the current stream, and ``planner.commit_tensor`` has been called for it.

    Raises:
        RuntimeError naming the file and the tensor when a file is shorter than its metadata says or cannot be
        read; what DCP's reader raises for the other items.
    """
    from .. import _C

    reads, rest = _plan_reads(reader, plan, planner)
    for (path, device), items in reads.items():
        segments = [(offset, n, target.data_ptr(), f"{req.dest_index.fqn} (offsets {list(req.dest_offsets)})")
                    for req, target, offset, n in items if n]
        if segments:
            with torch.vnpu.device(device):
                _C._read_into_device(path, segments, _CHUNK_BYTES, _SLOTS)
        for req, target, _, _ in items:
            planner.commit_tensor(req, target)
    if rest:
        return original(reader, dataclasses.replace(plan, items=rest), planner)
    done: torch.futures.Future = torch.futures.Future()
    done.set_result(None)
    return done
