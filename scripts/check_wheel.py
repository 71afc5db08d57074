"""Install check (issue #14, part 4): a built wheel installs into a fresh virtual environment and loads from
anywhere; a torch other than the one it was built for is refused with the versions named.

    .venv/bin/python scripts/check_wheel.py [--keep DIR]      # or: make check-wheel

1. ``pip wheel --no-build-isolation --no-deps .`` with the repository's .venv (scikit-build-core reuses
   ``build/<wheel tag>``, so after ``make install`` this is an incremental build);
2. a fresh ``python -m venv`` (nothing inherited) and ``pip install torch==2.13.0 <wheel>`` (torch from the local
   wheel directory pip is configured with);
3. ``python -c "import torch; torch.zeros(2, device='vnpu')"`` from a temporary directory, from the repository
   root and from tests/: it must run and use the
   fresh environment's torch_vnpu;
4. the wheel's metadata requires exactly ``torch==2.13.0`` (pip refuses another torch next to it);
5. a torch_vnpu built for another torch: the fresh environment's ``_build_info.py`` is rewritten to name another
   version (the check compares that string with ``torch.__version__``, so this is what an install next to another
   torch meets, without downloading one): ``import torch`` must fail with the versions named and no
   undefined-symbol error, and ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` must still import torch.

Prints each step with its time; exits 1 on the first failure. Every command has a timeout.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = ("import torch, torch_vnpu; x = torch.zeros(2, device='vnpu'); "
         "print(x.device, x.sum().item(), torch.__version__, torch_vnpu.__file__)")


def run(cmd: list[str], cwd: str, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))
    print(f"  [{time.perf_counter() - start:6.1f} s, exit {proc.returncode}] {' '.join(cmd)[:150]}  (in {cwd})")
    return proc


def fail(message: str, proc: subprocess.CompletedProcess | None = None) -> None:
    print(f"FAIL: {message}")
    if proc is not None:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
    raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", help="work in this directory and keep it (default: a temporary one, removed)")
    args = parser.parse_args()
    work = args.keep or tempfile.mkdtemp(prefix="vnpu-wheel-")
    os.makedirs(work, exist_ok=True)
    pip = os.path.join(ROOT, ".venv", "bin", "pip")
    try:
        print("1. build the wheel")
        dist = os.path.join(work, "dist")
        proc = run([pip, "wheel", "-q", "--no-build-isolation", "--no-deps", ".", "-w", dist], ROOT, 1800)
        wheels = glob.glob(os.path.join(dist, "torch_vnpu-*.whl"))
        if proc.returncode != 0 or len(wheels) != 1:
            fail("pip wheel", proc)
        wheel = wheels[0]
        print(f"   {os.path.basename(wheel)}, {os.path.getsize(wheel) / 2**20:.1f} MiB")

        print("2. a fresh virtual environment with torch==2.13.0 and the wheel")
        venv = os.path.join(work, "venv")
        shutil.rmtree(venv, ignore_errors=True)
        proc = run([sys.executable, "-m", "venv", venv], work, 300)
        if proc.returncode != 0:
            fail("python -m venv", proc)
        python = os.path.join(venv, "bin", "python")
        proc = run([python, "-m", "pip", "install", "-q", "torch==2.13.0", wheel], work, 1200)
        if proc.returncode != 0:
            fail("pip install", proc)

        print("3. import torch; torch.zeros(2, device='vnpu') from anywhere")
        site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], work, 60)
        purelib = site.stdout.strip()
        for cwd in (work, ROOT, os.path.join(ROOT, "tests")):
            proc = run([python, "-c", PROBE], cwd, 300)
            if proc.returncode != 0:
                fail(f"import from {cwd}", proc)
            device, total, version, path = proc.stdout.split()
            if device != "vnpu:0" or float(total) != 0.0 or not path.startswith(purelib):
                fail(f"from {cwd}: {proc.stdout!r} (expected vnpu:0, the fresh environment's torch_vnpu)")
            print(f"   {device}, torch {version}, torch_vnpu from {os.path.dirname(path)}")

        print("4. the wheel requires exactly torch==2.13.0")
        with zipfile.ZipFile(wheel) as z:
            meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist: torch")]
        if requires != ["Requires-Dist: torch==2.13.0"]:
            fail(f"wheel metadata: {requires}")
        print(f"   {requires[0]}")

        print("5. built for another torch: refused with the versions named")
        info = os.path.join(purelib, "torch_vnpu", "_build_info.py")
        original = open(info).read()
        try:
            with open(info, "w") as f:
                f.write(original.replace("2.13.0", "2.12.0"))
            proc = run([python, "-c", "import torch"], work, 300)
            if proc.returncode != 1 or "undefined symbol" in proc.stderr:
                fail("import torch with a mismatched build", proc)
            lines = proc.stderr.strip().splitlines()
            ours = [line for line in lines if line.startswith("ImportError: torch_vnpu was built for torch 2.12.0")]
            if not ours or "but torch 2.13.0" not in ours[0] or "Install torch==2.12.0" not in ours[0]:
                fail("the ImportError naming both versions is missing", proc)
            if not lines[-1].startswith("RuntimeError: Failed to load the backend extension: torch_vnpu"):
                fail("torch's autoload error is not the last line", proc)
            print(f"   {ours[0][:160]}...\n   last line: {lines[-1][:160]}")
            proc = run([python, "-c", "import torch; print(torch.zeros(1).device)"], work, 300,
                       env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
            if proc.returncode != 0 or proc.stdout.strip() != "cpu":
                fail("TORCH_DEVICE_BACKEND_AUTOLOAD=0 import torch", proc)
            print("   TORCH_DEVICE_BACKEND_AUTOLOAD=0: import torch works (cpu)")
        finally:
            with open(info, "w") as f:
                f.write(original)
        print("OK")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
