"""A checkpoint file opened once: its header, its data and torch.load's memory map all come from that one file,
even when a save renames another file over its path meanwhile (safetensors' own handle, a memory map taken at the
open, reads the file it opened too)."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator


class OpenedFile:
    """``path`` opened read-only; ``proc_path`` (``/proc/self/fd/N``) names this open file for libraries that take
    a path. Closed by ``close()``, ``with``, or when collected.

    Raises:
        OSError: as ``open(path)`` raises it (FileNotFoundError, PermissionError, ...).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self.fd = -1
        self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        self.proc_path = f"/proc/self/fd/{self.fd}"

    @property
    def closed(self) -> bool:
        return self.fd < 0

    def close(self, _close=os.close) -> None:  # (bound here: at interpreter exit `os` may be gone before this)
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            _close(fd)

    def __enter__(self) -> OpenedFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    @contextlib.contextmanager
    def naming_errors(self) -> Iterator[None]:
        """An OSError or RuntimeError whose message names ``proc_path`` is raised naming ``path``, the file the
        caller gave (same type)."""
        proc_path = self.proc_path
        try:
            yield
        except OSError as e:
            if e.filename == proc_path and e.errno is not None:
                raise type(e)(e.errno, e.strerror, self.path) from None
            if proc_path in str(e):
                raise type(e)(str(e).replace(proc_path, self.path)) from None
            raise
        except RuntimeError as e:
            if proc_path in str(e) and type(e) is RuntimeError:
                raise RuntimeError(str(e).replace(proc_path, self.path)) from None
            raise
