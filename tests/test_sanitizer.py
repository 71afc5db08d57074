"""VNPU_SANITIZE (torch.vnpu.sanitizer): each check's program is wrong without the sanitizer, raises the
named error with it, and runs clean with the fix (docs/sanitizer.md).

The sanitizer is per process and must be on before the first vnpu work, so the sanitized runs are fresh
processes (tests/sanitizer_cases.py); the unsanitized runs use this process.
"""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

import importlib.util

_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("sanitizer_cases", os.path.join(_HERE, "sanitizer_cases.py"))
cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cases)

RUNS = 5  # unsanitized runs per program: at least one must differ from CPU


def sanitized(case: str, fix: bool, extra_env=None) -> dict:
    env = dict(os.environ, VNPU_SANITIZE="1", **(extra_env or {}))
    out = subprocess.run(
        [sys.executable, os.path.join(_HERE, "sanitizer_cases.py"), case, "1" if fix else "0"],
        cwd=_HERE, env=env, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def wrong_without_sanitizer(case: str) -> bool:
    if torch.vnpu.sanitizer.is_enabled():
        pytest.skip("this process runs under VNPU_SANITIZE=1: the unsanitized half needs it off")
    for _ in range(RUNS):
        got, expected = cases.CASES[case](False)
        if not torch.equal(got, expected):
            return True
    return False


def test_stream_race_cross_stream_free_without_record_stream():
    assert wrong_without_sanitizer("free_without_record_stream")
    r = sanitized("free_without_record_stream", fix=False)
    assert r.get("error") == "StreamRaceError", r
    msg = r["message"]
    assert "aten::fill_" in msg  # the op that reuses the memory
    assert "aten::mul.Tensor" in msg  # the side stream's unordered read
    assert "[65536]" in msg and "torch.float32" in msg
    assert "stream_id=" in msg and "the default stream of vnpu:0" in msg
    assert "freed since" in msg and "record_stream" in msg
    assert "The tensor was allocated" in msg and "in free_without_record_stream" in msg  # allocation site
    assert sanitized("free_without_record_stream", fix=True) == {"ok": 0.0}


def test_stream_race_missing_wait_stream():
    assert wrong_without_sanitizer("missing_wait_stream")
    r = sanitized("missing_wait_stream", fix=False)
    assert r.get("error") == "StreamRaceError", r
    msg = r["message"]
    assert "'aten::add.Tensor'" in msg and "reads" in msg and "'aten::mul.Tensor'" in msg and "writes" in msg
    assert "wait_stream" in msg
    assert sanitized("missing_wait_stream", fix=True) == {"ok": 0.0}


def test_stream_race_host_kernel_reads_side_stream():
    assert wrong_without_sanitizer("host_op_reads_side_stream")
    r = sanitized("host_op_reads_side_stream", fix=False)
    assert r.get("error") == "StreamRaceError", r
    assert "aten::nonzero" in r["message"] and "the host" in r["message"]
    assert sanitized("host_op_reads_side_stream", fix=True) == {"ok": 0.0}


def test_use_after_free():
    assert wrong_without_sanitizer("use_after_free")
    r = sanitized("use_after_free", fix=False)
    assert r.get("error") == "UseAfterFreeError", r
    assert "aten::sum" in r["message"] and "poisoned" in r["message"]
    assert sanitized("use_after_free", fix=True) == {"ok": 0.0}


def test_unsynchronized_host_read_of_nonblocking_copy_sees_poison():
    # Check 3 by poisoning (docs/sanitizer.md, Note [Deferred host copies]): no error, but a read before the
    # synchronization sees NaN every time instead of the right values most of the time.
    assert wrong_without_sanitizer("nonblocking_copy_read_early")
    r = sanitized("nonblocking_copy_read_early", fix=False)
    assert "ok" in r and math.isnan(r["ok"]), r
    assert sanitized("nonblocking_copy_read_early", fix=True) == {"ok": 0.0}


def test_errors_are_runtime_errors():
    assert issubclass(torch.vnpu.sanitizer.StreamRaceError, RuntimeError)
    assert issubclass(torch.vnpu.sanitizer.UseAfterFreeError, RuntimeError)


_ENABLE_PROGRAM = r"""
import torch
assert not torch.vnpu.sanitizer.is_enabled()
torch.vnpu.sanitizer.enable()
assert torch.vnpu.sanitizer.is_enabled()
torch.vnpu.sanitizer.enable()  # idempotent
x = torch.ones(4, device="vnpu")
s = torch.vnpu.Stream()
with torch.vnpu.stream(s):
    try:
        x.add_(1)
    except torch.vnpu.sanitizer.StreamRaceError:
        print("raised")
"""

_LATE_ENABLE_PROGRAM = r"""
import torch
x = torch.ones(4, device="vnpu")
try:
    torch.vnpu.sanitizer.enable()
except RuntimeError as e:
    print("refused:", e)
print("enabled:", torch.vnpu.sanitizer.is_enabled())
"""


def _run(program: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "VNPU_SANITIZE"}
    out = subprocess.run([sys.executable, "-c", program], cwd=_HERE, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_enable_before_first_use():
    assert _run(_ENABLE_PROGRAM).strip() == "raised"


def test_enable_after_first_use_raises():
    out = _run(_LATE_ENABLE_PROGRAM)
    assert "refused:" in out and "VNPU_SANITIZE=1" in out and "before any vnpu work" in out
    assert "enabled: False" in out
