"""The installed package loads from anywhere, including the repository root (where the uncompiled source
tree torch_vnpu/ comes first on sys.path), and refuses a torch other than the one it was built for."""
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
    assert os.path.isfile(os.path.join(ROOT, "torch_vnpu", "__init__.py"))  # the source tree is there
    proc = _python("import torch, torch_vnpu, torch_vnpu.vnpu as m\n"
                   "print(torch_vnpu.__file__, m.__file__, torch.ones(3, device='vnpu').sum().item())", ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    init, sub, total = proc.stdout.split()
    installed = os.path.dirname(torch_vnpu.__file__)
    assert os.path.dirname(init) == installed and sub.startswith(installed) and float(total) == 3.0
    assert not init.startswith(os.path.join(ROOT, "torch_vnpu"))


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
