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
    # The free is the race (Note [Frees without record_stream]), reported at the next call: the op that
    # reuses the memory.
    assert "stream race at a free" in msg and "262144 bytes" in msg
    assert "reported at the next vnpu call, 'aten::fill_.Scalar'" in msg
    assert "'aten::mul.Tensor' on <torch.vnpu.Stream" in msg  # the side stream's unordered read
    assert "stream_id=" in msg and "freed on the default stream of vnpu:0" in msg
    assert "record_stream" in msg
    assert "The tensor was allocated" in msg and "in free_without_record_stream" in msg  # allocation site
    assert sanitized("free_without_record_stream", fix=True) == {"ok": 0.0}


def test_stream_race_free_without_record_stream_memory_not_reused():
    """The free itself is checked (Note [Frees without record_stream]): reported at the next vnpu call,
    although nothing reused the block (before: no report, and NaN from the poison fill racing the reader)."""
    if not torch.vnpu.sanitizer.is_enabled():  # right by luck without the sanitizer: nothing reuses the block
        got, expected = cases.CASES["free_without_record_stream_no_reuse"](False)
        assert torch.equal(got, expected)
    r = sanitized("free_without_record_stream_no_reuse", fix=False)
    assert r.get("error") == "StreamRaceError", r
    msg = r["message"]
    assert "stream race at a free" in msg and "262144 bytes" in msg
    assert "'aten::mul.Tensor' on <torch.vnpu.Stream" in msg and "reads it" in msg
    assert "freed on the default stream of vnpu:0" in msg
    assert "The tensor was allocated" in msg and "It was freed" in msg and "in _read_on_side_then_drop" in msg
    assert "reported at the next vnpu call, 'vnpuDeviceSynchronize'" in msg
    assert "record_stream" in msg
    assert sanitized("free_without_record_stream_no_reuse", fix=True) == {"ok": 0.0}


def test_record_stream_on_the_wrong_stream_is_reported_at_the_next_call():
    """A free with record_stream is checked at the free too, against the streams it was recorded on (before:
    only when a later allocation processed the block's events, never at exit, and "freed at" named that
    allocation's line)."""
    r = sanitized("record_stream_on_the_wrong_stream", fix=False)
    assert r.get("error") == "StreamRaceError", r
    msg = r["message"]
    assert "stream race at a free" in msg and "'aten::mul.Tensor' on <torch.vnpu.Stream" in msg
    assert "It was freed" in msg and "in record_stream_on_the_wrong_stream" in msg
    assert "reported at the next vnpu call, 'vnpuDeviceSynchronize'" in msg
    assert sanitized("record_stream_on_the_wrong_stream", fix=True) == {"ok": 0.0}


def test_free_race_poison_fill_waits_for_the_unordered_reader():
    # Before: the poison fill queued on the freeing stream ran while the side stream still had to read.
    assert sanitized("free_race_reader_result", fix=False) == {"ok": 0.0}
    assert sanitized("free_race_reader_result", fix=True) == {"ok": 0.0}


def test_disjoint_strided_slices_written_from_two_streams_run_clean():
    """Note [Strided accesses]: interleaved, disjoint slices are not a race (before: the whole span counted
    and this correct program raised StreamRaceError); overlapping ones still are."""
    assert sanitized("strided_slices_from_two_streams", fix=True) == {"ok": 0.0}
    r = sanitized("strided_slices_from_two_streams", fix=False)
    assert r.get("error") == "StreamRaceError", r
    assert "'aten::fill_.Scalar'" in r["message"] and "[2, 17, 8, 8]" in r["message"]
    assert sanitized("column_blocks_from_two_streams", fix=True) == {"ok": 0.0}
    r = sanitized("column_blocks_from_two_streams", fix=False)
    assert r.get("error") == "StreamRaceError", r
    assert "'aten::sum.dim_IntList'" in r["message"] and "'aten::add_" in r["message"]


def test_synchronizing_another_stream_does_not_release_a_nonblocking_copy():
    """Note [Deferred host copies]: the held-back copy runs when the host waits for something ordered after it
    (before: any host wait released every held copy, so syncing the wrong stream read the right values)."""
    if not torch.vnpu.sanitizer.is_enabled():
        got, expected = cases.CASES["nonblocking_copy_other_stream_synced"](False)
        assert torch.equal(got, expected)  # right by timing without the sanitizer
    r = sanitized("nonblocking_copy_other_stream_synced", fix=False)
    assert "ok" in r and math.isnan(r["ok"]), r
    assert sanitized("nonblocking_copy_other_stream_synced", fix=True) == {"ok": 0.0}


@pytest.mark.parametrize("case", ["pinned_round_trip", "pinned_upload_then_download_same_buffer"])
def test_pinned_buffer_used_both_ways_in_stream_order_runs_clean(case):
    """Note [Pinned buffers both ways]: found by the third break test, a false StreamRaceError ("host code
    rewrote") on these correct programs, and the device got NaN (the download's poison overwrote the buffer the
    queued upload had still to read)."""
    if not torch.vnpu.sanitizer.is_enabled():
        got, expected = cases.CASES[case](False)
        assert torch.equal(got, expected)
    assert sanitized(case, fix=True) == {"ok": 0.0}


def test_polling_a_pinned_destination_does_not_hang():
    """Note [Deferred host copies]: the held-back copy runs after at most a second without a host wait (found
    by the first break test: a polling loop never ended under the sanitizer)."""
    assert sanitized("poll_pinned_destination", fix=False) == {"ok": 0.0}
    assert sanitized("poll_pinned_destination", fix=True) == {"ok": 0.0}


def test_pinned_staging_buffer_rewritten_while_upload_queued():
    """Note [Pinned uploads]: before, no report (and wrong batches with and without the sanitizer)."""
    assert wrong_without_sanitizer("pinned_staging_rewritten")
    r = sanitized("pinned_staging_rewritten", fix=False)
    assert r.get("error") == "StreamRaceError", r
    msg = r["message"]
    assert "stream race on pinned memory" in msg and "262144 bytes" in msg and "'memcpy HtoD'" in msg
    assert "first changed byte at offset" in msg and "synchronize" in msg
    assert sanitized("pinned_staging_rewritten", fix=True) == {"ok": 0.0}


def test_pinned_rewrite_found_by_item_raises_there():
    """The wait inside .item() finds the rewritten source (Note [Pinned uploads]); before, it returned the
    later batch's sum and the report waited for a next vnpu call that never came."""
    assert wrong_without_sanitizer("pinned_staging_rewritten_then_item")
    r = sanitized("pinned_staging_rewritten_then_item", fix=False)
    assert r.get("error") == "StreamRaceError", r
    assert "stream race on pinned memory" in r["message"] and "'memcpy DtoH'" in r["message"]
    assert sanitized("pinned_staging_rewritten_then_item", fix=True) == {"ok": 0.0}


def test_pinned_staging_buffer_rewritten_while_a_graph_replay_reads_it():
    """Note [Pinned uploads] per replay: a captured pinned upload is snapshotted at each replay (before: only at
    the capture, so refilling the buffer under a queued replay was not reported)."""
    assert wrong_without_sanitizer("graph_pinned_staging_rewritten")
    r = sanitized("graph_pinned_staging_rewritten", fix=False)
    assert r.get("error") == "StreamRaceError", r
    assert "host code rewrote the pinned host memory" in r["message"]
    assert "'memcpy HtoD (in a graph replay)'" in r["message"]
    assert sanitized("graph_pinned_staging_rewritten", fix=True) == {"ok": 0.0}


def _run_case_process(case: str, fix: str) -> subprocess.CompletedProcess:
    """``sanitizer_cases.py CASE FIX`` under VNPU_SANITIZE=1, for its exit status and stderr."""
    return subprocess.run([sys.executable, os.path.join(_HERE, "sanitizer_cases.py"), case, fix], cwd=_HERE,
                          env=dict(os.environ, VNPU_SANITIZE="1"), capture_output=True, text=True, timeout=120)


def test_report_pending_at_exit_is_printed_and_fails_the_process():
    """A free without record_stream as the last vnpu work: reported at exit, exit status 1 (before: lost)."""
    def run(fix):
        return _run_case_process("free_race_as_last_vnpu_call", fix)

    bad = run("0")
    assert bad.returncode == 1, (bad.returncode, bad.stderr[-3000:])
    assert json.loads(bad.stdout.strip().splitlines()[-1]) == {"ok": 0.0}  # the program's own output came first
    assert "found after the program's last vnpu call" in bad.stderr
    assert "StreamRaceError" in bad.stderr and "stream race at a free" in bad.stderr
    assert "record_stream" in bad.stderr
    assert "this is reported at exit, after the program's last vnpu call" in bad.stderr  # not a runtime call's name
    assert "vnpuSanitizerCheckHostAccess" not in bad.stderr
    good = run("1")
    assert good.returncode == 0, good.stderr[-3000:]
    assert "last vnpu call" not in good.stderr


def test_a_caught_error_does_not_hide_a_later_one_at_exit():
    """Found by the fourth break test: once any sanitizer error had been raised, a later free race left pending at
    exit was not reported, even though the program had caught the first and gone on."""
    for case in ("caught_race_then_free_race_at_exit",
                 # the second tensor at the first one's address (fifth break test): allocations, not addresses
                 "caught_free_race_then_same_memory_free_race_at_exit"):
        bad = _run_case_process(case, "0")
        assert bad.returncode == 1, (case, bad.returncode, bad.stderr[-3000:])
        assert "found after the program's last vnpu call" in bad.stderr and "stream race at a free" in bad.stderr
        good = _run_case_process(case, "1")
        assert good.returncode == 0 and "last vnpu call" not in good.stderr, (case, good.stderr[-3000:])


def test_blocking_upload_then_side_stream_read_is_correct_and_clean():
    """Note [Blocking uploads synchronize] (ops Copy.cpp): a blocking copy to the device returns once it has
    run, as CUDA's copy_; before, the side stream read the tensor before the queued copy wrote it (wrong numbers
    and a StreamRaceError blaming a correct program)."""
    if not torch.vnpu.sanitizer.is_enabled():
        got, expected = cases.CASES["blocking_upload_read_on_side_stream"](False)
        assert torch.equal(got, expected)
    assert sanitized("blocking_upload_read_on_side_stream", fix=False) == {"ok": 0.0}


def test_tensor_allocated_on_one_stream_written_on_another_names_wait_stream():
    """Found by the fourth break test: the fix said record_stream (for a tensor no other stream had used);
    the bug is the side stream not waiting for the stream the new tensor was allocated on."""
    assert wrong_without_sanitizer("allocated_on_one_stream_written_on_another")
    r = sanitized("allocated_on_one_stream_written_on_another", fix=False)
    assert r.get("error") == "StreamRaceError", r
    msg = r["message"]
    assert "handed out again on the default stream of vnpu:0" in msg, msg
    assert "wait_stream(s) with s = the default stream of vnpu:0" in msg, msg
    assert "record_stream" not in msg.split("Fix:")[1], msg
    assert sanitized("allocated_on_one_stream_written_on_another", fix=True) == {"ok": 0.0}


def test_stream_race_missing_wait_stream():
    assert wrong_without_sanitizer("missing_wait_stream")
    r = sanitized("missing_wait_stream", fix=False)
    assert r.get("error") == "StreamRaceError", r
    msg = r["message"]
    assert "'aten::add.Tensor'" in msg and "reads" in msg and "'aten::mul.Tensor'" in msg and "writes" in msg
    assert "torch.vnpu.current_stream(0).wait_stream(s)" in msg  # the waiting stream's device, named
    assert sanitized("missing_wait_stream", fix=True) == {"ok": 0.0}


def test_a_copy_race_names_the_tensor():
    """A runtime copy's report names the tensor's shape, dtype and allocation site, as an op's does (before:
    only the bytes of the block)."""
    assert wrong_without_sanitizer("copy_reads_side_stream_output")
    r = sanitized("copy_reads_side_stream_output", fix=False)
    assert r.get("error") == "StreamRaceError", r
    msg = r["message"]
    assert "'memcpy DtoD'" in msg and "the tensor of shape [65536] and dtype torch.float32" in msg, msg
    assert "passed as the copy's source" in msg and "in copy_reads_side_stream_output" in msg, msg
    assert sanitized("copy_reads_side_stream_output", fix=True) == {"ok": 0.0}


def test_a_caught_race_is_not_reported_again_at_each_retry():
    """Before: each retry of the racing op raised again (found by the second break test)."""
    assert sanitized("race_caught_then_retried", fix=False) == {"ok": 0.0}  # one report of three tries
    assert sanitized("race_caught_then_retried", fix=True) == {"ok": 0.0}


def test_launch_blocking_does_not_hide_races():
    # VNPU_LAUNCH_BLOCKING waits after each launch; those waits are not the program's ordering, so the race is
    # still reported (found by a break test: with both variables set, check 1 reported nothing).
    r = sanitized("missing_wait_stream", fix=False, extra_env={"VNPU_LAUNCH_BLOCKING": "1"})
    assert r.get("error") == "StreamRaceError", r
    assert sanitized("missing_wait_stream", fix=True, extra_env={"VNPU_LAUNCH_BLOCKING": "1"}) == {"ok": 0.0}


def test_stream_race_host_kernel_reads_side_stream():
    assert wrong_without_sanitizer("host_op_reads_side_stream")
    r = sanitized("host_op_reads_side_stream", fix=False)
    assert r.get("error") == "StreamRaceError", r
    assert "aten::nonzero" in r["message"] and "the host" in r["message"]
    assert sanitized("host_op_reads_side_stream", fix=True) == {"ok": 0.0}


def test_stream_race_against_graph_replay():
    # A replay declares its captured kernels' accesses at its own position on the replay stream
    # (Note [Sanitizer and graphs]): writing the static input on the replay stream after the capture is
    # ordered (the first replay in the case), a side stream writing it unordered with a replay is a race.
    assert wrong_without_sanitizer("graph_replay_race")
    r = sanitized("graph_replay_race", fix=False)
    assert r.get("error") == "StreamRaceError", r
    msg = r["message"]
    assert "'aten::mul.Tensor (in a graph replay)' on the default stream of vnpu:0 reads" in msg, msg
    # The side stream's copy_ of a dense tensor runs as a device-to-device memcpy (named as CUDA names it).
    assert "stream_id=" in msg and "writes" in msg and ("memcpy DtoD" in msg or "aten::copy_" in msg), msg
    assert "The tensor was allocated" in msg and "in graph_replay_race" in msg, msg
    assert "wait_stream" in msg, msg
    assert sanitized("graph_replay_race", fix=True) == {"ok": 0.0}


_COMPILED_RACE_PROGRAM = r"""
import json, sys
import torch
import torch._inductor.config as config
config.cpp_wrapper = sys.argv[1] == "1"
f = torch.compile(lambda x: (x * 2).sin())  # one fused C++ kernel, reading x
n = 1 << 16
main = torch.vnpu.current_stream()
x = torch.zeros(n, device="vnpu")
f(x)  # compiles
torch.vnpu.synchronize()
out = {}
for case in ("fix", "bug"):
    side = torch.vnpu.Stream()
    side.wait_stream(main)
    with torch.vnpu.stream(side):
        torch.vnpu._sleep(100_000_000)
        x.fill_(1.0 if case == "fix" else 2.0)
    if case == "fix":
        main.wait_stream(side)
    try:
        y = f(x)
        torch.vnpu.synchronize()
        expected = torch.full((n,), 1.0 if case == "fix" else 2.0).mul(2).sin()
        out[case] = float((y.cpu() - expected).abs().max())
    except torch.vnpu.sanitizer.StreamRaceError as e:
        out[case] = "StreamRaceError: " + str(e)
    torch.vnpu.synchronize()
print(json.dumps(out))
"""


# The C++ wrapper case compiles one more C++ module (~75 s under load): `make test-slow`.
@pytest.mark.parametrize("cpp_wrapper", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["python_wrapper", "cpp_wrapper"])
def test_stream_race_through_compiled_kernel(cpp_wrapper):
    # Inductor's fused kernels declare their pointer arguments, from the Python wrapper's bindings and from
    # the C++ wrapper (InductorLaunchApi::declare_access): a side stream writing a compiled graph's input
    # unordered with the graph is reported at the kernel's launch; with wait_stream it runs clean.
    env = dict(os.environ, VNPU_SANITIZE="1")
    out = subprocess.run([sys.executable, "-c", _COMPILED_RACE_PROGRAM, "1" if cpp_wrapper else "0"], cwd=_HERE,
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["fix"] < 1e-5, r
    msg = r["bug"]
    assert isinstance(msg, str) and msg.startswith("StreamRaceError: "), r
    assert "cpp_fused" in msg and " reads " in msg and "input pointer" in msg and "aten::fill_" in msg, msg
    assert "wait_stream" in msg, msg


def test_use_after_free():
    assert wrong_without_sanitizer("use_after_free")
    r = sanitized("use_after_free", fix=False)
    assert r.get("error") == "UseAfterFreeError", r
    assert "aten::sum" in r["message"] and "poisoned" in r["message"]
    # Where the freed tensor came from (before: no allocation site for freed memory).
    assert "The freed tensor was allocated at:" in r["message"] and "in use_after_free" in r["message"]
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
