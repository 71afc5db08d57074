"""Bad VNPU_* environment variables: no devices, a warning naming the variable, a clear error on use, and the
process (CPU work) unaffected — as torch.cuda behaves with a broken driver setup. Each case runs in a fresh
interpreter because the runtime reads its configuration once."""
import json
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


# Boolean VNPU_* variables (Note [Boolean environment variables] in the runtime): PyTorch's own rule, as
# c10::utils::check_env applies it to TORCH_* flags: "1" is on, "0" is off, unset is the default, and any
# other value is ignored with a warning that names the variable and the value.
FLAG_PROBE = """
import json, warnings, torch
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    torch.vnpu.device_count()
    try:
        torch._assert_async(torch.zeros((), device="vnpu"))   # fails on the device
        at_call = False
    except RuntimeError:
        at_call = True
    try:
        torch.vnpu.synchronize()
    except RuntimeError:
        pass
print(json.dumps({"at_call": at_call, "flag": torch.vnpu._C._launch_blocking(),
                  "warnings": [str(w.message) for w in caught if "VNPU_" in str(w.message)]}))
"""

# (the runtime's GoogleTests cover more spellings: TRUE, yes, 2, on, "")
_FLAG_CASES = {"1": True, "0": False, None: False, "true": None, " 1": None}


@pytest.fixture(scope="module")
def flag_runs():
    procs = {}
    for value in _FLAG_CASES:
        env = {k: v for k, v in os.environ.items() if k != "VNPU_LAUNCH_BLOCKING"}
        if value is not None:
            env["VNPU_LAUNCH_BLOCKING"] = value
        procs[value] = subprocess.Popen([sys.executable, "-c", FLAG_PROBE], env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, cwd=os.path.dirname(__file__))
    out = {}
    for value, p in procs.items():
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr[-2000:]
        out[value] = json.loads(stdout.strip().splitlines()[-1])
    return out


@pytest.mark.parametrize("value", list(_FLAG_CASES), ids=lambda v: repr(v))
def test_launch_blocking_follows_pytorch_boolean_rule(flag_runs, value):
    r = flag_runs[value]
    expected = _FLAG_CASES[value]
    if expected is None:  # not understood: the default (asynchronous) and one warning naming it
        assert r["at_call"] is False and r["flag"] is False
        assert len(r["warnings"]) == 1, r["warnings"]
        assert f"VNPU_LAUNCH_BLOCKING: '{value}'" in r["warnings"][0]
        assert "valid values are 0 or 1" in r["warnings"][0]
    else:
        assert r["at_call"] is expected and r["flag"] is expected
        assert r["warnings"] == []
