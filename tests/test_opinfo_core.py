"""A small OpInfo parity slice in the default run: common ops, all listed dtypes, forward (functional,
in-place, out=) and gradients, vnpu vs CPU through scripts/opinfo_parity.py. The wider slice is
tests/test_opinfo_slice.py (`make opinfo-slice`), the full sweep `make opinfo`."""
import json
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..")
OPS = "add,mul,sub,div,sum,mean,matmul,addmm,bmm,cat,where,index_select,gather,softmax,log_softmax," \
      "nn.functional.layer_norm,nn.functional.gelu,nn.functional.linear,nn.functional.embedding,exp,clamp"


def test_common_ops_match_cpu(tmp_path):
    out = tmp_path / "opinfo.json"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "opinfo_parity.py"), "--ops", OPS,
                        "--no-errors", "--jobs", "0", "--limit-samples", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads(out.read_text())
    totals = data["totals"]
    assert totals["cases"] > 500
    assert totals["failed"] == 0, json.dumps(data["failing_cases"], indent=1)[:3000]
