"""``python -m torch_vnpu.port.run script.py [args...]`` (or ``-m module [args...]``): run a CUDA program on vnpu
unedited, as ``__main__``, with port mode switched on (``torch_vnpu.port.cuda``).

Exits with status 1 and a message, without running anything, when vnpu is not available.
"""

from __future__ import annotations

import runpy
import sys


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv == ["-m"]:
        print(__doc__)
        raise SystemExit(0 if argv and argv[0] != "-m" else 2)
    from . import _cuda

    try:
        _cuda.enable()
    except RuntimeError as e:
        print(f"torch_vnpu.port.run: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
