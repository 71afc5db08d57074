"""safetensors files to and from vnpu memory: read straight into the device, written through a ring of pinned buffers.

Loading: the file is validated by safetensors itself (same errors as a CPU load), tensors are allocated on the
device, and each tensor's bytes are read from the file straight into its device memory by the device's file reads
(Note [Checkpoint reads], csrc/io/FileRead.cpp), on the current stream and a second one: no host copy of the file,
and work queued on the stream afterwards sees the bytes (the call returns once every read finished).

Saving: the file safetensors would write (same header, same layout), the tensors' bytes downloaded into the ring
on their devices' current streams (after the work queued there) and written out as each download lands.
"""

from __future__ import annotations

import json
import os
import struct

import torch

from ._files import OpenedFile

__all__ = ["load_file", "save_file"]

_CHUNK_BYTES = 16 << 20
_SLOTS = 4


def _header(file: OpenedFile) -> tuple[int, dict]:
    """(start of the data region, header entries) of the open ``file``, validated by safetensors (its
    SafetensorError on a bad file). A header already validated for this file (same device, inode and size, the
    same header bytes) is not parsed again."""
    st = os.fstat(file.fd)
    key = (st.st_dev, st.st_ino, st.st_size)
    cached = _headers.get(key)
    if cached is not None:
        raw, start, header = cached
        if os.pread(file.fd, start, 0) == raw:
            return start, header
    from safetensors import safe_open

    with file.naming_errors(), safe_open(file.proc_path, framework="pt", device="cpu"):
        pass  # validates header, offsets and sizes, of this file even if its path names another one by now
    (n,) = struct.unpack("<Q", os.pread(file.fd, 8, 0))
    raw = os.pread(file.fd, 8 + n, 0)
    header = json.loads(raw[8:])
    header.pop("__metadata__", None)
    if len(_headers) > 64:
        _headers.clear()
    _headers[key] = (raw, 8 + n, header)
    return 8 + n, header


# (st_dev, st_ino, st_size) -> (the 8 + n header bytes, start of the data region, entries): a file's header is
# checked byte for byte before it is reused (a file rewritten in place keeps its inode)
_headers: dict[tuple[int, int, int], tuple[bytes, int, dict]] = {}


def load_file(path: str | os.PathLike, device: str | int | torch.device = "vnpu", *, dtype: torch.dtype | None = None,
              chunk_bytes: int = _CHUNK_BYTES, slots: int = _SLOTS) -> dict[str, torch.Tensor]:
    """Load a safetensors file onto a vnpu device, as ``safetensors.torch.load_file(path, device)``.

    Args:
        path: the ``.safetensors`` file.
        device: a vnpu device (``"vnpu"``, ``"vnpu:1"``, ``1``, ``torch.device("vnpu", 1)``).
        dtype: if given, floating-point tensors are converted to it on the device (other tensors keep theirs).
        chunk_bytes, slots: reads of up to ``chunk_bytes`` bytes each, at most ``slots`` queued at a time.

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
    path = os.fspath(path)
    if not (isinstance(chunk_bytes, int) and isinstance(slots, int) and chunk_bytes > 0 and slots > 0):
        raise ValueError(f"chunk_bytes and slots must be positive integers, got {chunk_bytes!r} and {slots!r}")
    device = torch.device("vnpu", device) if isinstance(device, int) else torch.device(device)
    if device.type != "vnpu":
        raise ValueError(f"torch_vnpu.checkpoints.safetensors.load_file loads onto vnpu devices, got {device}")
    if device.index is None:
        device = torch.device("vnpu", torch.vnpu.current_device())
    with OpenedFile(path) as file:
        return _load(file, device, dtype, chunk_bytes, slots)


def _load(file: OpenedFile, device: torch.device, dtype: torch.dtype | None, chunk_bytes: int,
          slots: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import _TYPES

    path, fd = file.path, file.fd
    start, header = _header(file)
    out: dict[str, torch.Tensor] = {}
    segments = []
    converted = []  # (name, file offset, bytes, stored dtype) of tensors read into another dtype
    others = []  # dtypes only safetensors' own reader builds (packed float4, float8_e8m0, ...)
    with torch.vnpu.device(device):
        try:
            for name, entry in header.items():
                if entry["dtype"] not in _TYPES:
                    others.append(name)
                    continue
                begin, end = entry["data_offsets"]
                stored = _TYPES[entry["dtype"]]
                if dtype is not None and stored.is_floating_point and stored != dtype:
                    converted.append((name, start + begin, end - begin, stored))
                    t = torch.empty(entry["shape"], dtype=dtype, device=device)
                else:
                    t = torch.empty(entry["shape"], dtype=stored, device=device)
                    if end > begin:
                        segments.append((start + begin, end - begin, t.data_ptr(), name))
                out[name] = t
            t = None
            from .. import _C
            from ._progress import bar

            with bar(sum(seg[1] for seg in segments), "Loading", path) as progress:
                _C._read_into_device(path, segments, chunk_bytes, slots, progress=progress.callback, fd=fd)
            for name, offset, nbytes, stored in converted:
                _read_converted(path, fd, offset, nbytes, stored, out[name], name)
            if others:
                from safetensors import safe_open

                with safe_open(file.proc_path, framework="pt", device="cpu") as f:
                    for name in others:
                        out[name] = f.get_tensor(name).to(device)
        except BaseException:
            # Nothing stays allocated (the traceback keeps this frame): the memory goes back to the allocator,
            # stream-ordered after the uploads already queued.
            out.clear()
            t = None
            raise
        if dtype is not None:  # safetensors' own reader's tensors
            out = {k: v.to(dtype) if v.is_floating_point() else v for k, v in out.items()}
    return out


def _read_converted(path: str, fd: int, offset: int, nbytes: int, stored: torch.dtype, out: torch.Tensor,
                    name: str) -> None:
    """Read a tensor stored as ``stored`` into ``out`` (contiguous, another dtype), converted on the device a chunk
    at a time through one scratch buffer of at most 16 MiB: the device never holds the whole tensor in both dtypes
    (a load that fits in the requested dtype does not run out of memory for the stored one). Stream-ordered."""
    from .. import _C

    flat = out.view(-1)
    step = max(1, _CHUNK_BYTES // stored.itemsize)  # elements per chunk
    scratch = torch.empty(min(nbytes, step * stored.itemsize), dtype=torch.uint8, device=out.device)
    for first in range(0, flat.numel(), step):
        n = min(step, flat.numel() - first)
        _C._read_into_device(path, [(offset + first * stored.itemsize, n * stored.itemsize, scratch.data_ptr(), name)],
                             _CHUNK_BYTES, _SLOTS, fd=fd)
        flat[first:first + n].copy_(scratch[: n * stored.itemsize].view(stored))


def read_tensor(path: str | os.PathLike, name: str, device: torch.device, file: OpenedFile | None = None,
                dtype: torch.dtype | None = None) -> torch.Tensor | None:
    """One tensor of a safetensors file read into vnpu memory (the file's header validated by safetensors once);
    None if its dtype has no torch name here (packed float4, ...): read it with safetensors.

    ``file``: the file opened earlier (a safe_open handle's), read instead of what ``path`` names now.
    ``dtype``: the tensor converted to it on the device (``Tensor.to(dtype)``), a chunk at a time.
    Stream-ordered as load_file. Raises what load_file raises; KeyError naming the file for an unknown name."""
    from safetensors.torch import _TYPES

    from .. import _C

    path = os.fspath(path)
    own = file is None
    if own:
        file = OpenedFile(path)
    fd = file.fd
    try:
        start, header = _header(file)
        if name not in header:
            raise KeyError(f"{path} has no tensor named {name!r}")
        entry = header[name]
        if entry["dtype"] not in _TYPES:
            return None
        begin, end = entry["data_offsets"]
        stored = _TYPES[entry["dtype"]]
        with torch.vnpu.device(device):
            out = torch.empty(entry["shape"], dtype=stored if dtype is None else dtype, device=device)
            if end > begin and out.dtype != stored:
                _read_converted(path, fd, start + begin, end - begin, stored, out, name)
            elif end > begin:
                _C._read_into_device(path, [(start + begin, end - begin, out.data_ptr(), name)], _CHUNK_BYTES, _SLOTS,
                                     fd=fd)
        return out
    finally:
        if own:
            file.close()


_dtype_rank: dict[str, int] | None = None


def _safetensors_order() -> dict[str, int]:
    """safetensors' layout order of its dtypes (it writes tensors by descending dtype, then by name), read from a
    file safetensors writes, not restated here."""
    global _dtype_rank
    if _dtype_rank is None:
        from safetensors.torch import _TYPES, save

        probe = {code: torch.zeros(8, dtype=torch.uint8).view(dt) for code, dt in _TYPES.items() if dt.itemsize <= 8}
        data = save(probe)
        (n,) = struct.unpack("<Q", data[:8])
        _dtype_rank = {entry["dtype"]: i for i, entry in enumerate(json.loads(data[8:8 + n]).values())}
    return _dtype_rank


_SAVE_CHUNK_BYTES = 4 << 20  # a chunk per event: a smaller staging ring costs less pinned memory, not speed


def save_file(tensors: dict[str, torch.Tensor], filename: str | os.PathLike, metadata: dict[str, str] | None = None,
              *, chunk_bytes: int = _SAVE_CHUNK_BYTES, slots: int = _SLOTS) -> None:
    """Save tensors (on vnpu devices, or on the CPU) as ``safetensors.torch.save_file`` does, byte for byte.

    The device writes the tensors' memory into the file in chunks of up to ``chunk_bytes`` bytes, ``slots`` chunks
    in flight, on their devices' current streams after the work queued there (what the tensors hold as of the
    call's position in stream order; ``cuFileWrite``'s role): no CPU copy of each tensor, no growth of host memory.
    A device without file writes (``VNPU_FILE_WRITES=0``) downloads the chunks into ``slots`` pinned buffers and
    writes each as it lands. The file is written under a temporary name next to ``filename`` and renamed over it
    at the end.

    Args:
        tensors: {name: tensor}; contiguous, dense, not sharing memory (as safetensors requires).
        filename: the ``.safetensors`` file to write.
        metadata: text-only metadata for the header (``{str: str}``).
        chunk_bytes, slots: the chunk size in bytes and the chunks in flight.

    Raises:
        ValueError: not a dict of tensors, a sparse or non-contiguous tensor (safetensors' messages), or
            ``chunk_bytes`` / ``slots`` not positive.
        TypeError: a name, or a metadata key or value, that is not a ``str`` (safetensors' message).
        RuntimeError: tensors sharing memory (safetensors' message), or an I/O error naming the file and the
            tensor; an earlier file at ``filename`` is then left as it was.
    """
    from safetensors.torch import _TYPES, _evaluate_tensors_for_save

    if not (isinstance(chunk_bytes, int) and isinstance(slots, int) and chunk_bytes > 0 and slots > 0):
        raise ValueError(f"chunk_bytes and slots must be positive integers, got {chunk_bytes!r} and {slots!r}")
    _evaluate_tensors_for_save(tensors)
    # safetensors' own TypeErrors (its Rust binding's argument checks), for the same inputs
    for argument, mapping, values_too in (("tensor_dict", tensors, False), ("metadata", metadata or {}, True)):
        for k, v in mapping.items():
            bad = k if not isinstance(k, str) else v if values_too and not isinstance(v, str) else None
            if bad is not None:
                raise TypeError(f"argument '{argument}': '{type(bad).__name__}' object is not an instance of 'str'")
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(f"You are trying to save a non contiguous tensor: `{name}` which is not allowed; call "
                             "`.contiguous()` on it first (safetensors' rule).")
        if t.device.type not in ("cpu", "vnpu"):
            raise ValueError(f"tensor `{name}` is on {t.device}; this writer saves vnpu and CPU tensors")
    # A conjugate or negative view holds its values only with the bit applied: the file gets the values (what
    # .cpu() gives), computed on the tensor's device; its memory is another tensor's.
    tensors = {k: t.resolve_conj().resolve_neg() if t.is_conj() or t.is_neg() else t for k, t in tensors.items()}
    codes = {dt: code for code, dt in _TYPES.items()}
    rank = _safetensors_order()
    order = sorted(tensors, key=lambda k: (rank[codes[tensors[k].dtype]], k))
    header: dict = {} if metadata is None else {"__metadata__": metadata}
    offset = 0
    sources = []
    for name in order:
        t = tensors[name]
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": codes[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
        if nbytes:
            sources.append((t.data_ptr(), nbytes, t.device.index if t.device.type == "vnpu" else -1, name))
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    raw += b" " * (-len(raw) % 8)
    from .. import _C
    from ._progress import bar

    with bar(offset, "Saving", filename) as progress:
        _C._write_from_device(os.fspath(filename), struct.pack("<Q", len(raw)) + raw, sources, chunk_bytes, slots,
                              progress=progress.callback)


def can_save(tensors: object) -> bool:
    """Whether save_file writes these tensors (a dict with a vnpu tensor, every tensor of a dtype safetensors.torch
    names, on vnpu or the CPU); otherwise safetensors' own save_file is the one to call."""
    from safetensors.torch import _TYPES

    if not isinstance(tensors, dict) or not tensors:
        return False
    values = list(tensors.values())
    if not all(isinstance(v, torch.Tensor) for v in values):
        return False
    known = set(_TYPES.values())
    return (any(v.device.type == "vnpu" for v in values)
            and all(v.device.type in ("cpu", "vnpu") and v.dtype in known for v in values))
