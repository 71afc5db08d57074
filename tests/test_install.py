"""The installed package loads from anywhere, including the repository root and the source tree (src layout:
the uncompiled src/torch_vnpu/ is never on sys.path by accident), and refuses a torch other than the one it was
built for."""
import os
import subprocess
import sys

import torch

import torch_vnpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code: str, cwd: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, **env))


def test_import_torch_from_the_repository_root():
    assert os.path.isfile(os.path.join(ROOT, "src", "torch_vnpu", "__init__.py"))  # the source tree is there
    proc = _python("import torch, torch_vnpu, torch_vnpu.vnpu as m\n"
                   "print(torch_vnpu.__file__, m.__file__, torch.ones(3, device='vnpu').sum().item())", ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    init, sub, total = proc.stdout.split()
    installed = os.path.dirname(torch_vnpu.__file__)
    assert os.path.dirname(init) == installed and sub.startswith(installed) and float(total) == 3.0
    assert not init.startswith(os.path.join(ROOT, "src"))


def test_port_runner_from_the_repository_root(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import torch\nprint(torch.ones(2, device='cuda').device)\n")
    proc = subprocess.run([sys.executable, "-m", "torch_vnpu.port.run", str(script)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "vnpu:0", proc.stderr[-3000:]


def test_built_for_this_torch():
    from torch_vnpu._build_info import TORCH_VERSION

    assert TORCH_VERSION == torch.__version__


def test_another_torch_version_is_refused_with_the_versions_named(tmp_path):
    proc = _python("import torch\ntorch.__version__ = '2.99.0'\nimport torch_vnpu", str(tmp_path),
                   TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: torch_vnpu was built for torch 2.13.0")
    assert "but torch 2.99.0 is loaded" in last and "Install torch==2.13.0" in last


def test_import_torch_with_a_build_for_another_torch_names_both_versions(tmp_path):
    # What `import torch` (torch's backend autoload) shows when the installed torch_vnpu was built for another
    # torch: a copy of the installed package (symlinks: the same _C) whose _build_info names torch 2.12.0, first
    # on sys.path (the working directory). Loading _C would be the undefined-symbol crash; it must not be reached.
    installed = os.path.dirname(torch_vnpu.__file__)
    copy = tmp_path / "torch_vnpu"
    copy.mkdir()
    for name in os.listdir(installed):
        if name not in ("_build_info.py", "__pycache__"):
            os.symlink(os.path.join(installed, name), copy / name)
    (copy / "_build_info.py").write_text('TORCH_VERSION = "2.12.0+cpu"\n')
    proc = _python("import torch", str(tmp_path))
    assert proc.returncode == 1 and "undefined symbol" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    ours = [line for line in lines if line.startswith("ImportError: torch_vnpu was built for torch 2.12.0+cpu")]
    assert ours and f"but torch {torch.__version__} is loaded" in ours[0] and "Install torch==2.12.0" in ours[0]
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in ours[0]
    # torch wraps the entry point's error: its RuntimeError, caused by ours, is the last line.
    assert lines[-1].startswith("RuntimeError: Failed to load the backend extension: torch_vnpu.")
    proc = _python("import torch; print(torch.ones(1).device)", str(tmp_path), TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert proc.returncode == 0 and proc.stdout.strip() == "cpu", proc.stderr[-2000:]


def test_import_torch_inside_the_source_package():
    # Python started in src/torch_vnpu/ puts that directory first on sys.path: a module there named like a
    # standard library one (it was multiprocessing.py) would replace it for every import, torch's own included.
    src = os.path.join(ROOT, "src", "torch_vnpu")
    names = {n[:-3] if n.endswith(".py") else n for n in os.listdir(src) if n != "__pycache__"}
    assert not names & sys.stdlib_module_names, names & sys.stdlib_module_names
    proc = _python("import torch, multiprocessing, torch_vnpu\n"
                   "print(multiprocessing.__file__, torch_vnpu.__file__, torch.ones(2, device='vnpu').device)\n"
                   "torch.vnpu.ipc_collect()", src)
    assert proc.returncode == 0, proc.stderr[-3000:]
    mp_file, init, device = proc.stdout.split()
    assert not mp_file.startswith(src) and os.path.dirname(mp_file) == os.path.dirname(os.__file__) + "/multiprocessing"
    assert os.path.dirname(init) == os.path.dirname(torch_vnpu.__file__) and device == "vnpu:0"
