"""Metadata of a benchmark run, recorded in every benchmark's JSON under the key "run".

scripts/bench_page.py renders docs/benchmarks.md from these fields, so a figure on that page always comes
with the machine, date, command and load it was measured at. Standard library only: the spawn-based
benchmarks do not import torch in their parent process, so versions are read from the installed packages.

    run_meta = _meta.begin(__file__, argv)   # first thing in main(): the load average before any work
    ...
    json.dump({"run": _meta.end(run_meta), ...}, f)
"""

import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
import time


def _cpu_model():
    """The CPU's model name (Linux /proc/cpuinfo; elsewhere what platform knows)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _commit():
    """The source tree's commit, "+dirty" with uncommitted changes; None outside a git checkout."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        rev = subprocess.run(["git", "-C", here, "describe", "--always", "--dirty=+dirty", "--abbrev=12"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return rev.stdout.strip() or None


def begin(script, argv=None):
    """The run's metadata so far; call before the measurement so the load average is the one before it.

    `argv` is what main() parses (None: the command line); the command is rebuilt from the script's name so it
    reads the same however the benchmark was started (from the Makefile, a test, another directory).
    """
    args = sys.argv[1:] if argv is None else list(argv)
    return {
        "benchmark": os.path.splitext(os.path.basename(script))[0],
        "command": shlex.join(["python", f"benchmarks/{os.path.basename(script)}", *args]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "torch_vnpu": _version("torch-vnpu"),
        "commit": _commit(),
        "load_average_before": list(os.getloadavg()),
        "_t0": time.perf_counter(),
    }


def end(run):
    """`run` completed with the load average after the measurement and the wall time it took."""
    done = {k: v for k, v in run.items() if k != "_t0"}
    done["load_average_after"] = list(os.getloadavg())
    done["duration_s"] = round(time.perf_counter() - run["_t0"], 1)
    return done
