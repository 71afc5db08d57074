"""Sparse-layout parity of OpInfo ops: vnpu vs CPU on the sparse sample inputs of torch's op_db.

scripts/opinfo_parity.py runs every OpInfo on its strided samples. This script runs the sparse ones: for each OpInfo
that declares support for a sparse layout (supports_sparse, supports_sparse_csr/csc/bsr/bsc), the samples of
``op.sample_inputs_sparse(layout, "cpu", dtype)`` run on CPU (the oracle) and, moved to vnpu, on vnpu. A case passes
when both raise the same exception type, or both return results of the same device/layout/dtype/shape whose
components are equal (default tolerances of torch.testing.assert_close; random ops: metadata only). Run from outside the repository root:

    cd tests && ../.venv/bin/python ../scripts/sparse_parity.py [--dtypes float32,float64] [--json out.json]
"""
import argparse
import collections
import json
import sys
import warnings

import torch
from torch.testing._internal.common_methods_invocations import op_db

LAYOUTS = {
    torch.sparse_coo: "supports_sparse",
    torch.sparse_csr: "supports_sparse_csr",
    torch.sparse_csc: "supports_sparse_csc",
    torch.sparse_bsr: "supports_sparse_bsr",
    torch.sparse_bsc: "supports_sparse_bsc",
}


def _to(x, dev):
    return x.to(dev) if isinstance(x, torch.Tensor) else x


def _parts(x):
    """The tensors a result is made of (vnpu runs CPU's kernels, so even uncoalesced results match exactly; some
    CPU results are not valid enough for to_dense, e.g. masked.amax with keepdim on CSR)."""
    if x.layout == torch.sparse_coo:
        return [x._indices(), x._values()]
    if x.layout in (torch.sparse_csr, torch.sparse_bsr):
        return [x.crow_indices(), x.col_indices(), x.values()]
    if x.layout in (torch.sparse_csc, torch.sparse_bsc):
        return [x.ccol_indices(), x.row_indices(), x.values()]
    return [x]


def run_case(op, sample):
    try:
        exp = op(sample.input, *sample.args, **sample.kwargs)
        cpu_err = None
    except Exception as e:  # the oracle's own errors must be reproduced
        exp, cpu_err = None, e
    s = sample.transform(lambda t: _to(t, "vnpu"))
    try:
        got = op(s.input, *s.args, **s.kwargs)
    except Exception as e:
        if cpu_err is not None and type(e) is type(cpu_err):
            return "pass", ""
        return "fail", f"vnpu raised {type(e).__name__}: {str(e).splitlines()[0][:160]}" + (
            f" (cpu raised {type(cpu_err).__name__})" if cpu_err else "")
    if cpu_err is not None:
        return "fail", f"vnpu did not raise (cpu raised {type(cpu_err).__name__})"
    want_device = torch.device(sample.kwargs.get("device", "vnpu")).type  # e.g. zeros_like(x, device="cpu")
    flat_exp = torch.utils._pytree.tree_leaves(exp)
    flat_got = torch.utils._pytree.tree_leaves(got)
    if len(flat_exp) != len(flat_got):
        return "fail", "different number of results"
    for e, g in zip(flat_exp, flat_got):
        if not isinstance(e, torch.Tensor):
            if e != g:
                return "fail", f"value {g!r} != {e!r}"
            continue
        if g.device.type != want_device or g.layout != e.layout or g.dtype != e.dtype or g.shape != e.shape:
            return "fail", f"result {g.device}/{g.layout}/{g.dtype}/{tuple(g.shape)} vs cpu {e.layout}/{e.dtype}/{tuple(e.shape)}"
        if "rand" in op.name:  # random draws differ from CPU's by design (docs/limitations.md): metadata only
            continue
        try:
            for gp, ep in zip(_parts(g.cpu()), _parts(e), strict=True):
                torch.testing.assert_close(gp, ep, equal_nan=True)
        except AssertionError as err:
            return "fail", "value mismatch: " + " ".join(str(err).split())[:160]
        except Exception as err:
            return "fail", f"comparison raised {type(err).__name__}: {str(err).splitlines()[0][:160]}"
    return "pass", ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--ops", default="", help="comma-separated OpInfo names (default: all)")
    ap.add_argument("--json")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    wanted = set(filter(None, args.ops.split(",")))
    totals = collections.Counter()
    per_layout = collections.defaultdict(collections.Counter)
    failures = []
    for op in op_db:
        name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        if wanted and name not in wanted and op.name not in wanted:
            continue
        for layout, flag in LAYOUTS.items():
            if not getattr(op, flag, False):
                continue
            for dtype in dtypes:
                if dtype not in op.supported_dtypes("cpu"):
                    continue
                try:
                    samples = list(op.sample_inputs_sparse(layout, "cpu", dtype))
                except Exception:
                    totals["samplegen_error"] += 1
                    continue
                for i, sample in enumerate(samples):
                    status, msg = run_case(op, sample)
                    totals[status] += 1
                    per_layout[str(layout).replace("torch.", "")][status] += 1
                    if status == "fail":
                        failures.append(dict(op=name, layout=str(layout), dtype=str(dtype), idx=i, msg=msg))
    print(f"sparse samples: {totals['pass']} passed, {totals['fail']} failed "
          f"({totals['samplegen_error']} sample generations failed on CPU)")
    for layout, c in per_layout.items():
        print(f"  {layout}: {c['pass']}/{c['pass'] + c['fail']}")
    by_op = collections.Counter(f["op"] for f in failures)
    for op, n in by_op.most_common():
        first = next(f for f in failures if f["op"] == op)
        print(f"  FAIL {op}: {n} ({first['layout']} {first['dtype']}: {first['msg']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(totals=totals, per_layout=per_layout, failures=failures), f, indent=1)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
