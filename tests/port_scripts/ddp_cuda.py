"""A CUDA DDP script in the shape of PyTorch's DDP tutorial (torchrun launch, torch.cuda.set_device, backend
"nccl", DDP(device_ids=[gpu])), plus a "cpu:gloo,cuda:nccl" group and init_device_mesh("cuda"). Run unedited under
``torchrun ... -m torch_vnpu.port.run ddp_cuda.py OUT``; rank 0 writes OUT (json)."""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.distributed.distributed_c10d import is_nccl_available
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP


def ddp_setup():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    # device_id: the eager-init form PyTorch's docs recommend
    init_process_group(backend="nccl", device_id=torch.device(f"cuda:{local_rank}"))


def main(out):
    ddp_setup()
    gpu = int(os.environ["LOCAL_RANK"])
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(20, 1).to(gpu), device_ids=[gpu])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    losses = []
    for _ in range(5):
        x = torch.randn(32, 20, generator=g).to(gpu)
        y = torch.randn(32, 1, generator=g).to(gpu)
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    pair = dist.new_group(list(range(dist.get_world_size())), backend="cpu:gloo,cuda:nccl")
    on_cpu = torch.full((2,), float(rank + 1))
    dist.all_reduce(on_cpu, group=pair)
    on_gpu = torch.full((2,), float(rank + 1), device="cuda")
    dist.all_reduce(on_gpu, group=pair)
    mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    on_mesh = torch.ones(3, device="cuda") * (rank + 1)
    dist.all_reduce(on_mesh, group=mesh.get_group())
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"losses": losses, "weight": model.module.weight.detach().cpu().tolist(),
                       "bias": model.module.bias.detach().cpu().tolist(), "device": str(model.module.weight.device),
                       "backend": dist.get_backend(), "nccl_available": [dist.is_nccl_available(), is_nccl_available(),
                                          dist.is_backend_available("nccl"),
                                          dist.is_backend_available("cpu:gloo,cuda:nccl")],
                       "pair": [on_cpu.tolist(), on_gpu.tolist(), str(on_gpu.device), dist.get_backend(pair)],
                       "mesh": [mesh.device_type, on_mesh.tolist(), str(on_mesh.device)]}, f)
    destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
