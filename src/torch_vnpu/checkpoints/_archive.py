"""torch.save archives (zip): whether their tensor bytes can be read from the file as they are."""

from __future__ import annotations

import sys
from typing import Any

import torch


def raw_bytes(archive_file: Any) -> bool:
    """Whether a ``torch.save`` archive (a path or a binary file object) holds its tensor bytes as torch.load would
    use them: the entries stored, not compressed, and in this host's byte order. The byte order is the archive's
    ``byteorder`` record or, without one, ``torch.serialization.get_default_load_endianness()``, as torch.load
    decides whether to byteswap (``None`` and ``LITTLE`` mean little-endian, ``NATIVE`` never swaps)."""
    import zipfile

    with zipfile.ZipFile(archive_file) as archive:
        infos = archive.infolist()
        if any(i.compress_type != zipfile.ZIP_STORED for i in infos if "/data/" in i.filename):
            return False
        orders = [i for i in infos if i.filename.endswith("/byteorder")]
        if orders:
            order = archive.read(orders[0]).decode(errors="replace")
        else:
            endianness = torch.serialization.LoadEndianness
            default = torch.serialization.get_default_load_endianness()
            order = {None: "little", endianness.LITTLE: "little", endianness.BIG: "big"}.get(default, sys.byteorder)
    return order == sys.byteorder
