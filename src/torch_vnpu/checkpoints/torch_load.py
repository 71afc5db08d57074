"""``torch.load(path, map_location=<a vnpu device>)`` with every storage read from the file into vnpu memory.

torch.load restores each storage by building it in host memory (read from the file, or a memory map of it) and
copying it to the device, one blocking copy per storage. Here torch.load runs as it would with ``mmap=True`` and a
``map_location`` function: for each storage, torch hands over its slice of the file's memory map (never touched,
so never read through the map); the storage's place in the file is found from that mapping, a vnpu storage is
allocated and the bytes are read from the file straight into it, in stream order on the current stream
(Note [Checkpoint reads], csrc/io). Unpickling, ``weights_only`` checks and the result's structure (shared
storages, views, Parameters) stay torch.load's own.
"""

from __future__ import annotations

import os
import sys

import torch

from ._archive import raw_bytes
from ._files import OpenedFile

__all__ = ["load", "streams"]

_CHUNK_BYTES = 16 << 20
_SLOTS = 4


def _vnpu_device(map_location: object) -> torch.device | None:
    """The vnpu device ``map_location`` names (a string, a torch.device), else None."""
    if isinstance(map_location, str):
        try:
            map_location = torch.device(map_location)
        except RuntimeError:
            return None
    if isinstance(map_location, torch.device) and map_location.type == "vnpu":
        index = map_location.index if map_location.index is not None else torch.vnpu.current_device()
        return torch.device("vnpu", index)
    return None


def streams(f: object, map_location: object) -> bool:
    """Whether ``load`` takes this call: a path (with a UTF-8 name, as torch's memory map needs), loaded to a vnpu
    device. ``load`` then checks the file itself and hands anything it cannot read in place to torch.load."""
    if _vnpu_device(map_location) is None or not isinstance(f, (str, os.PathLike)):
        return False
    try:
        os.fspath(f).encode()
    except (UnicodeEncodeError, TypeError):
        return False
    return True


def _readable_in_place(path: str) -> bool:
    """Whether the storages of the file at ``path`` can be read at their offsets: torch.save's zip format (not a
    TorchScript archive), tensor data stored as it is (not compressed), in the byte order torch.load would leave
    it in (it byteswaps a foreign one before handing the storage over)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            if any(n.endswith("/constants.pkl") for n in z.namelist()):  # TorchScript: torch.jit.load's
                return False
        return raw_bytes(path)
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


def _records(fd: int, path: str) -> dict[int, int]:
    """{file offset of a storage record's data: its size in bytes}, from the zip's directory and each record's
    local header (where the data starts, as torch.load finds it)."""
    import struct
    import zipfile

    out = {}
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            if "/data/" not in info.filename or info.filename.endswith("/serialization_id"):
                continue
            header = os.pread(fd, 30, info.header_offset)
            if len(header) < 30 or header[:4] != b"PK\x03\x04":
                continue  # no record there: a storage said to be at its data is refused
            name_len, extra_len = struct.unpack_from("<HH", header, 26)
            out[info.header_offset + 30 + name_len + extra_len] = info.file_size
    return out


class _FileMap:
    """Where a host address inside the memory map of ``path`` lies in the file (from /proc/self/maps)."""

    def __init__(self, path: str):
        self.path = os.fsencode(os.path.realpath(path))  # /proc/self/maps holds raw bytes, not text
        self.ranges: list[tuple[int, int, int]] = []  # (start, end, file offset of start)

    def offset(self, address: int) -> int | None:
        """The file offset of ``address``; the end of a mapping counts (where an empty slice past it points)."""
        for start, end, pgoff in self.ranges:
            if start <= address <= end:
                return address - start + pgoff
        self._read_maps()
        for start, end, pgoff in self.ranges:
            if start <= address <= end:
                return address - start + pgoff
        return None

    def _read_maps(self) -> None:
        self.ranges = []
        with open("/proc/self/maps", "rb") as maps:
            for line in maps:
                parts = line.split(maxsplit=5)
                if len(parts) == 6 and parts[5].rstrip(b"\n") == self.path:
                    start, end = (int(x, 16) for x in parts[0].split(b"-"))
                    self.ranges.append((start, end, int(parts[2], 16)))


def load(f: str | os.PathLike, map_location: str | torch.device, *, chunk_bytes: int = _CHUNK_BYTES,
         slots: int = _SLOTS, **kwargs) -> object:
    """``torch.load(f, map_location=map_location, **kwargs)`` for a vnpu ``map_location``, streamed.

    Args:
        f: path of a file written by ``torch.save`` (its zip format). A file whose storages cannot be read at
            their offsets (the legacy format, compressed entries, the other byte order, a TorchScript archive) is
            loaded by torch.load's own path.
        map_location: a vnpu device (``"vnpu"``, ``"vnpu:1"``, ``torch.device("vnpu", 1)``).
        chunk_bytes, slots: reads of up to ``chunk_bytes`` bytes each, at most ``slots`` queued at a time.
        kwargs: torch.load's other arguments (``weights_only``, ``pickle_module``, ``mmap``, ...), unchanged.

    Returns:
        What torch.load returns, its storages on the vnpu device, each read as torch.load restores it (so what
        unpickling computes from a tensor sees its bytes). Work queued on the current stream afterwards sees the
        bytes. The file is opened once: a file renamed over ``f`` meanwhile is not mixed in.

    Raises:
        Whatever torch.load raises for the file (``pickle.UnpicklingError`` for a ``weights_only`` violation, ...);
        RuntimeError naming the file when it ends early, changes size while loaded, or cannot be read;
        torch.OutOfMemoryError when the checkpoint does not fit. The storages allocated so far are freed.
        ValueError: ``map_location`` is not a vnpu device, or ``f`` is not a path with a UTF-8 name.
    """
    from .. import _C

    device = _vnpu_device(map_location)
    if device is None or not streams(f, map_location):
        raise ValueError(f"streamed torch.load needs a path with a UTF-8 name and a vnpu map_location, "
                         f"got {f!r} and {map_location!r}")
    import torch.serialization

    path = os.fspath(f)
    # The checks, torch.load's map and the reads all see this one open file, even if a save renames another file
    # over `path` meanwhile.
    file = OpenedFile(path)
    if not _readable_in_place(file.proc_path):
        file.close()  # torch.load's own path (a host copy per storage), for whatever file `path` names now
        return torch.serialization.load(f, map_location=map_location, **kwargs)
    fd = file.fd
    where = _FileMap(file.proc_path)
    size = os.fstat(fd).st_size
    records = _records(fd, file.proc_path)

    from ._progress import bar

    progress = bar(size, "Loading", path)
    done = 0

    def restore(storage: torch.UntypedStorage, location: str) -> torch.UntypedStorage:
        # Read as torch.load asks for the storage, before unpickling goes on: a __setstate__ or a rebuild function
        # (a nested tensor's sizes) may read it, as it may on CPU.
        nonlocal done
        if os.fstat(fd).st_size != size:  # torch's slice of its map may then be short (a storage it would resize)
            raise RuntimeError(f"{path} changed size while being loaded (from {size} to {os.fstat(fd).st_size} "
                               "bytes): load it again once it is written")
        nbytes = storage.nbytes()
        offset = where.offset(storage.data_ptr())
        if offset is not None and offset + nbytes >= size:
            # A record's data always ends before the zip's directory: torch's slice was cut at the end of the map
            # (a record header pointing past the end), and torch would resize the storage to unread memory.
            raise RuntimeError(f"{path}: the storage at byte {offset} ({nbytes} bytes) runs to the end of the file "
                               f"({size} bytes): the file is truncated or corrupt")
        if nbytes and offset is None:  # not a slice of the file's map (torch changed how it maps): copy it
            return storage.to(device=device)
        if nbytes and records.get(offset) != nbytes:  # (torch.load without mmap checks this; with mmap it does not)
            raise RuntimeError(f"{path}: the storage at byte {offset} ({nbytes} bytes) is not one whole record of the "
                               f"file (record size {records.get(offset)}): the file is corrupt")
        with torch.vnpu.device(device):
            out = torch.UntypedStorage(nbytes, device=device)
            if nbytes:
                base = done
                _C._read_into_device(path, [(offset, nbytes, out.data_ptr(), f"storage at byte {offset}")],
                                     chunk_bytes, slots, progress=lambda n: progress.callback(base + n), fd=fd)
                done += nbytes
        return out

    kwargs.pop("mmap", None)
    result = None
    try:
        with file.naming_errors():
            result = torch.serialization.load(file.proc_path, map_location=restore, mmap=True, **kwargs)  # torch's own
        return result
    except (RuntimeError, OSError, KeyboardInterrupt) as e:  # out of memory, a failed read, Ctrl-C
        # Nothing stays allocated: torch.load's frames below this one (kept by the traceback, with the closures
        # that hold the storages restored so far) are dropped from the traceback, and the storages go back to
        # the allocator (stream-ordered) once that reference cycle is collected. (Other exceptions, bugs
        # rather than conditions to recover from, keep their whole traceback.)
        import gc

        if e.__traceback__ is not None and e.__traceback__.tb_frame is sys._getframe():
            e.__traceback__.tb_next = None
        result = None  # noqa: F841 (drops the storages before the collection)
        gc.collect()
        raise
    finally:
        progress.close()
        file.close()
