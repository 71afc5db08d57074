#!/usr/bin/env python
"""OpInfo parity sweep: every OpInfo of torch's op_db on vnpu vs CPU (issue #3).

Examples (run from outside the repository root, e.g. `cd tests`, with the package installed):
  python ../scripts/opinfo_parity.py --ops "add,mul,sum,matmul" --jobs 1 --json /tmp/slice.json
  python ../scripts/opinfo_parity.py --jobs 2 --limit-samples 4 --json ../out/opinfo.json --markdown ../docs/ops_coverage.md
  python ../scripts/opinfo_parity.py --from-json ../out/opinfo.json --markdown ../docs/ops_coverage.md

The implementation is src/torch_vnpu/testing/opinfo.py: this checkout's copy when there is one, else the
installed package's (see _load).
"""
import os
import sys


def _load():
    """This checkout's src/torch_vnpu/testing/opinfo.py (so the harness being edited is the one that runs, even
    if the installed package is older), else the installed torch_vnpu.testing.opinfo. The checkout's module
    is imported as the top-level module `opinfo`, which does not shadow the installed torch_vnpu (whose
    compiled extension the source tree lacks)."""
    import torch  # noqa: F401  (loads torch_vnpu through the torch.backends entry point)

    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.abspath(os.path.join(here, "..", "src", "torch_vnpu", "testing"))
    if os.path.exists(os.path.join(src, "opinfo.py")):
        sys.path.insert(0, src)  # also seen by spawned workers (multiprocessing passes sys.path)
        import opinfo
    else:
        from torch_vnpu.testing import opinfo
    return opinfo


if __name__ == "__main__":
    sys.exit(_load().main())
