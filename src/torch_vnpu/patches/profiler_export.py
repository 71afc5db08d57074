"""A profiler trace export that fails keeps the trace.

torch 2.13 hands ``export_chrome_trace(path)`` to Kineto, which cannot open an unwritable path, logs
"Failed to open", raises nothing and marks the trace saved: a retry to a good path then raises "Trace is already
saved" and the recording is lost (on CPU and CUDA alike). This opens the destination first, so such a path
raises Python's own ``OSError`` (``FileNotFoundError``, ``PermissionError``, ``IsADirectoryError``) before
anything is handed over, and the trace can be exported again to another path.
"""

from __future__ import annotations

import functools
import os

from . import replace


def _check_writable(path) -> None:
    """Raise the OSError that writing ``path`` would raise (creates it empty if missing; the export fills it)."""
    with open(os.fspath(path), "ab"):
        pass


def install() -> None:
    import torch.autograd.profiler as autograd_profiler
    import torch.profiler.profiler as profiler

    for owner in (autograd_profiler.profile, profiler._KinetoProfile):
        export = owner.export_chrome_trace
        if getattr(export, "_vnpu_checks_path", False):
            continue

        @functools.wraps(export)
        def export_chrome_trace(self, path, *args, _export=export, **kwargs):
            _check_writable(path)
            return _export(self, path, *args, **kwargs)

        export_chrome_trace._vnpu_checks_path = True
        replace(owner, "export_chrome_trace", export_chrome_trace, "profiler.export-checks-path")
