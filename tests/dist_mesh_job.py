"""torchrun job for tests/test_distributed_device_selection.py: the script a user writes for CUDA
(init_process_group(), then init_device_mesh, no set_device) and collectives on every device."""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

dist.init_process_group()
out = {"initialized_after_init_process_group": torch.vnpu.is_initialized()}
ws, rank = dist.get_world_size(), dist.get_rank()
mesh = init_device_mesh("vnpu", (ws,))
out["current_device"] = torch.vnpu.current_device()
out["local_rank"] = int(os.environ["LOCAL_RANK"])
# every rank on each device in turn, also on a device other than its own: results must be exact
for shift in range(torch.vnpu.device_count()):
    dev = torch.device("vnpu", (rank + shift) % torch.vnpu.device_count())
    t = torch.arange(1000, dtype=torch.float64, device=dev) * (rank + 1)
    dist.all_reduce(t)
    g = [torch.empty(3, dtype=torch.int32, device=dev) for _ in range(ws)]
    dist.all_gather(g, torch.full((3,), rank + 10, dtype=torch.int32, device=dev))
    out[f"all_reduce_{shift}"] = t.cpu().tolist()[:5] + [float(t.sum())]
    out[f"all_gather_{shift}"] = [x.cpu().tolist() for x in g]
dist.barrier()
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
