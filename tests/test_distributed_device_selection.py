"""Device selection under torchrun, as with CUDA and NCCL: init_process_group() does not initialize vnpu,
so init_device_mesh("vnpu", ...) puts each rank on vnpu:LOCAL_RANK by itself; and collectives address
each rank's memory on the device its tensors are on (also a device other than the rank's own)."""

import json
import os
import subprocess
import sys

from torch_vnpu.testing.distributed import free_port

JOB = os.path.join(os.path.dirname(__file__), "dist_mesh_job.py")


def test_init_device_mesh_under_torchrun_selects_local_rank_device(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(free_port()), JOB, str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=os.path.dirname(__file__))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    expected_sum = sum(range(1000)) * (1 + 2)
    for r, out in enumerate(ranks):
        assert out["initialized_after_init_process_group"] is False
        assert out["local_rank"] == r and out["current_device"] == r
        for shift in range(2):
            assert out[f"all_reduce_{shift}"] == [0.0, 3.0, 6.0, 9.0, 12.0, float(expected_sum)]
            assert out[f"all_gather_{shift}"] == [[10, 10, 10], [11, 11, 11]]


def test_split_group_after_a_group_that_left_ranks_out(tmp_path):
    # vccl's split used the store torch passes, prefixed with a name hashed from the number of groups each
    # process knows: rank 0 (outside the earlier new_group) and rank 1 waited for each other for 30 min.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-port",
           str(free_port()), os.path.join(os.path.dirname(__file__), "dist_split_job.py"), str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=os.path.dirname(__file__),
                          env={**os.environ, "VNPU_DEVICE_COUNT": "4"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert got == [[1.0] * 4, [1.0] * 4, [5.0] * 4, [5.0] * 4]
