"""Bad VNPU_* environment variables: no devices, a warning naming the variable, a clear error on use, and the
process (CPU work) unaffected — as torch.cuda behaves with a broken driver setup. Each case runs in a fresh
interpreter because the runtime reads its configuration once."""
import os
import subprocess
import sys

import pytest

PROBE = """
import torch
print("count", torch.vnpu.device_count(), "available", torch.vnpu.is_available())
try:
    torch.ones(2, device="vnpu")
    print("created")
except RuntimeError as e:
    print("error", str(e))
print("cpu", torch.ones(3).sum().item())
"""


def _probe(env):
    full = dict(os.environ, **env)
    p = subprocess.run([sys.executable, "-c", PROBE], env=full, capture_output=True, text=True, timeout=120,
                       cwd=os.path.dirname(__file__))
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout, p.stderr


@pytest.mark.parametrize("env,needle", [
    ({"VNPU_MEMORY_PER_DEVICE": "8X"}, "VNPU_MEMORY_PER_DEVICE=8X is not a size"),
    ({"VNPU_DEVICE_COUNT": "two"}, "VNPU_DEVICE_COUNT=two is not a device count"),
    ({"VNPU_MEMORY_PER_DEVICE": "100T", "VNPU_DEVICE_COUNT": "64"}, "cannot reserve"),
])
def test_bad_configuration_is_reported(env, needle):
    out, err = _probe(env)
    assert "count 0 available False" in out, out
    assert "error vNPU is not available: " + needle in out, out
    assert needle in err  # the warning at device_count()
    assert "cpu 3.0" in out


def test_memory_sizes_parse():
    out, _ = _probe({"VNPU_MEMORY_PER_DEVICE": "1.5G"})
    assert "count 2 available True" in out and "created" in out, out
    code = "import torch; print(torch.vnpu.get_device_properties(0).total_memory)"
    p = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, VNPU_MEMORY_PER_DEVICE="64MB"),
                       capture_output=True, text=True, timeout=120, cwd=os.path.dirname(__file__))
    assert int(p.stdout.split()[-1]) == 64 << 20, p.stdout + p.stderr[-1000:]
