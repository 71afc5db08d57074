"""docs/benchmarks.md is generated from the benchmarks' JSON (scripts/bench_page.py): a real benchmark run in its
smallest configuration, then the generator; the page must carry that run's figures and metadata, and say which
benchmarks have not run."""

import json
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def _run(args, cwd):
    proc = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _table_row(page, first_cell):
    """The header and the cells of the first table row whose first cell is `first_cell`."""
    lines = page.splitlines()
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            j = i
            while lines[j - 1].startswith("|"):
                j -= 1
            header = [c.strip() for c in lines[j].strip().strip("|").split("|")]
            return dict(zip(header, cells))
    raise AssertionError(f"no table row {first_cell!r} in the page")


def test_page_carries_the_json_figures_and_metadata(tmp_path):
    bench = tmp_path / "bench"
    _run([os.path.join(ROOT, "benchmarks", "eager_overhead.py"), "--out", str(bench), "--ops", "add_2x2",
          "--iters", "50", "--repeats", "1", "--warmup", "5"], cwd=tmp_path)
    page_path = tmp_path / "benchmarks.md"
    _run([os.path.join(ROOT, "scripts", "bench_page.py"), "--in", str(bench), "--out", str(page_path)], cwd=tmp_path)
    data = json.loads((bench / "eager_overhead.json").read_text())
    page = page_path.read_text()

    # The ratios in the page are the JSON's (rounded to the page's 2 decimals), in their columns.
    summary = data["summary"][0]
    row = _table_row(page, "`add_2x2`")
    assert abs(float(row["host vnpu/cpu"]) - summary["ratio_host"]) <= 0.005, (row, summary)
    assert abs(float(row["e2e vnpu/cpu"]) - summary["ratio_e2e"]) <= 0.005, (row, summary)
    assert abs(float(row["cpu µs"]) - summary["cpu_us"]) <= 0.005, (row, summary)

    # The run's metadata, recorded by the benchmark (benchmarks/_meta.py) and shown with its section.
    run = data["run"]
    assert run["command"] == ("python benchmarks/eager_overhead.py --out " + str(bench)
                              + " --ops add_2x2 --iters 50 --repeats 1 --warmup 5")
    assert run["cpu_count"] == os.cpu_count() and run["cpu_model"]
    assert len(run["load_average_before"]) == 3 and run["torch"] and run["torch_vnpu"]
    assert f"- Machine: {run['cpu_model']}, {run['cpu_count']} logical CPUs" in page
    assert f"- Command: `{run['command']}`" in page
    assert f"- Date: {run['date'].replace('T', ' ')}" in page
    assert ", ".join(f"{x:.2f}" for x in run["load_average_before"]) + " before the run" in page

    # Every other benchmark: a line with the command that produces its JSON.
    assert page.count("Not run yet:") == 13, page
    for script in ("train_step.py", "compile.py", "compile_cpp_wrapper.py", "hf_step.py", "graph_replay.py",
                   "decode.py", "port_overhead.py", "checkpoint_io.py", "async_save.py", "collectives.py", "dist_train_step.py"):
        assert f"Not run yet: `python benchmarks/{script} --out {bench}`" in page, script
    assert f"Not run yet: `python benchmarks/eager_overhead.py --out {bench}`" not in page
