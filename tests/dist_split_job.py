"""torchrun job for tests/test_distributed_device_selection.py: split_group after a new_group that left rank 0
out (torch names the split's store from the number of groups each process knows, one fewer on rank 0)."""

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

lr = int(os.environ["LOCAL_RANK"])
dist.init_process_group(device_id=torch.device("vnpu", lr), timeout=datetime.timedelta(seconds=60))
rank, ws = dist.get_rank(), dist.get_world_size()
dist.new_group(list(range(1, ws)))
g = dist.split_group(split_ranks=[list(range(ws // 2)), list(range(ws // 2, ws))],
                     timeout=datetime.timedelta(seconds=60))
t = torch.full((4,), float(rank), device=f"vnpu:{lr}")
dist.all_reduce(t, group=g)
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(t.cpu().tolist(), f)
dist.destroy_process_group()
