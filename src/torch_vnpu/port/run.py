"""``python -m torch_vnpu.port.run script.py [args...]`` (or ``-m module [args...]``): run a CUDA program on vnpu
unedited, as ``__main__``, with port mode switched on (``torch_vnpu.port.cuda``).

Exits as ``python`` does when the script cannot be opened (status 2, ``can't open file ...``) or the module is not
found (status 1, ``No module named ...``), and with status 1 and a message, without running anything, when vnpu is
not available.
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import sys

_PROG = "torch_vnpu.port.run"


def _fail(message: str, status: int) -> None:
    print(f"{_PROG}: {message}", file=sys.stderr)
    raise SystemExit(status)


def _check_target(argv: list[str]) -> None:
    """Python's own checks and messages for a missing script or module, before port mode starts."""
    if argv[0] == "-m":
        try:
            found = importlib.util.find_spec(argv[1]) is not None
        except (ImportError, ValueError) as e:
            _fail(f"Error while finding module specification for {argv[1]!r} ({type(e).__name__}: {e})", 1)
        if not found:
            _fail(f"No module named {argv[1]}", 1)
    elif not os.path.exists(argv[0]):
        path = os.path.abspath(argv[0])
        _fail(f"can't open file {path!r}: [Errno 2] No such file or directory", 2)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv == ["-m"]:
        print(__doc__)
        raise SystemExit(0 if argv and argv[0] != "-m" else 2)
    _check_target(argv)
    from . import _cuda

    try:
        _cuda.enable()
    except RuntimeError as e:
        _fail(str(e), 1)
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
