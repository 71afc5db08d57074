"""A CUDA DDP script in the shape of pytorch/examples ddp-tutorial-series multigpu.py: mp.spawn of one process per
GPU (torch.cuda.device_count()), MASTER_ADDR/PORT, backend "nccl", DDP(device_ids=[rank]). Run unedited under
``python -m torch_vnpu.port.run ddp_spawn_cuda.py OUT PORT``; rank 0 writes OUT (json)."""
import os, sys, json
import torch, torch.multiprocessing as mp, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

def ddp_setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"; os.environ["MASTER_PORT"] = sys.argv[2]
    torch.cuda.set_device(rank)
    dist.init_process_group(backend="nccl", rank=rank, world_size=world_size)

def main(rank, world_size, out):
    ddp_setup(rank, world_size)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(20, 1).to(rank), device_ids=[rank])
    x = torch.randn(8, 20, generator=torch.Generator().manual_seed(rank)).to(rank)
    model(x).square().mean().backward()
    g = model.module.weight.grad.detach().cpu()
    if rank == 0:
        json.dump({"grad": g.tolist(), "device": str(model.module.weight.device), "backend": dist.get_backend()}, open(out, "w"))
    dist.destroy_process_group()

if __name__ == "__main__":
    world_size = torch.cuda.device_count()
    mp.spawn(main, args=(world_size, sys.argv[1]), nprocs=world_size)
