"""A Lightning user's script, and the LightningModule of tests/test_lightning.py.

``python lightning_job.py --accelerator vnpu --devices 2 --phases trainer-ddp,fabric-ddp --out DIR`` runs each
phase as a user would write it (``Trainer(accelerator=..., devices=2, strategy="ddp")``, ``Fabric(...)``);
Lightning's own launcher starts the script once more for rank 1. Every rank writes ``DIR/<phase>-rank<r>.json``
(its losses, the devices its parameters and batches were on, the process group's backend) and rank 0 the
final parameters (``DIR/<phase>.pt``, from Lightning's checkpoint). The phases share the process group: a
later phase finds ``LOCAL_RANK`` set and ``torch.distributed`` initialized, as in any script that fits twice.
"""
import argparse
import json
import os
import warnings

import torch

import lightning as L

SAMPLES = 40


class Regressor(L.LightningModule):
    """A 2-layer MLP regressing the sum of 8 features; records what each training step saw."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
        self.losses, self.dtypes, self.devices_seen, self.state_devices = [], [], set(), set()
        self.param_devices, self.batch_devices = set(), set()

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self.net(x)
        self.dtypes.append(out.dtype)
        self.devices_seen |= {p.device.type for p in self.parameters()} | {x.device.type}
        self.param_devices |= {str(p.device) for p in self.parameters()}
        self.batch_devices.add(str(x.device))
        opt_state = self.optimizers().optimizer.state.values()  # AdamW's exp_avg, exp_avg_sq (after a step)
        self.state_devices |= {v.device.type for st in opt_state for v in st.values() if torch.is_tensor(v) and v.dim()}
        loss = torch.nn.functional.mse_loss(out.float(), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def loader(batch_size: int = 8, shuffled_as_trainer: bool = False) -> torch.utils.data.DataLoader:
    """40 fixed samples, in order. Several processes: Fabric's DistributedSampler gives rank r of W the samples
    r, r + W, ...; the Trainer's shuffles the training set first (seed 0, epoch 0: ``randperm``) and gives rank r
    the permutation's r, r + W, .... Either way the W ranks' k-th batches of ``batch_size`` together are the
    one-process k-th batch of ``W * batch_size`` in that order: ``shuffled_as_trainer=True`` is the Trainer's
    order for one process (a DistributedSampler of 1 replica with the Trainer's seed)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, 8, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True) + 0.1 * torch.randn(SAMPLES, 1, generator=g))
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0) \
        if shuffled_as_trainer else None
    return torch.utils.data.DataLoader(data, batch_size=batch_size, sampler=sampler)


def _dist_facts() -> dict:
    dist = torch.distributed
    if not dist.is_initialized():
        return {"backend": None, "world_size": 1}
    return {"backend": str(dist.get_backend()), "world_size": dist.get_world_size()}


def _trainer(args, strategy: str, out: str, precision: str = "32-true") -> dict:
    model = Regressor()
    trainer = L.Trainer(accelerator=args.accelerator, devices=args.devices, strategy=strategy, max_steps=5,
                        precision=precision,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's tips about num_workers, litlogger
        trainer.fit(model, loader(args.batch_size))
        # Every rank calls it; Lightning gathers the full state (FSDP) and rank 0 writes it.
        trainer.save_checkpoint(os.path.join(out, f"{args.phase}.ckpt"))
    if trainer.global_rank == 0:
        ckpt = torch.load(os.path.join(out, f"{args.phase}.ckpt"), map_location="cpu", weights_only=False)
        torch.save(ckpt["state_dict"], os.path.join(out, f"{args.phase}.pt"))
    return {"losses": model.losses, "param_devices": sorted(model.param_devices),
            "batch_devices": sorted(model.batch_devices), "state_devices": sorted(model.state_devices),
            "strategy": type(trainer.strategy).__name__, "root_device": str(trainer.strategy.root_device),
            "dtypes": sorted({str(d) for d in model.dtypes}), "precision_plugin": type(trainer.precision_plugin).__name__,
            "global_rank": trainer.global_rank, **_dist_facts()}


def _fabric(args, strategy: str, out: str) -> dict:
    if strategy == "fsdp":  # Fabric saves FSDP checkpoints sharded (a directory) unless told otherwise
        from lightning.fabric.strategies import FSDPStrategy

        fabric = L.Fabric(accelerator=args.accelerator, devices=args.devices,
                          strategy=FSDPStrategy(state_dict_type="full"))
    else:
        fabric = L.Fabric(accelerator=args.accelerator, devices=args.devices, strategy=strategy)
    fabric.launch()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = fabric.setup(model, optimizer)
    losses, param_devices, batch_devices = [], set(), set()
    for x, y in fabric.setup_dataloaders(loader(args.batch_size)):
        loss = torch.nn.functional.mse_loss(model(x), y)
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        param_devices |= {str(p.device) for p in model.parameters()}
        batch_devices.add(str(x.device))
    fabric.save(os.path.join(out, f"fabric-{strategy}.ckpt"), {"model": model})
    fabric.barrier()
    if fabric.global_rank == 0:
        state = torch.load(os.path.join(out, f"fabric-{strategy}.ckpt"), map_location="cpu", weights_only=False)
        torch.save({f"net.{k}": v for k, v in state["model"].items()}, os.path.join(out, f"fabric-{strategy}.pt"))
    return {"losses": losses, "param_devices": sorted(param_devices), "batch_devices": sorted(batch_devices),
            "strategy": type(fabric.strategy).__name__, "root_device": str(fabric.device),
            "global_rank": fabric.global_rank, **_dist_facts()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--accelerator", default="vnpu")
    parser.add_argument("--devices", default="2")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--phases", default="trainer-ddp,fabric-ddp")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    args.devices = int(args.devices) if args.devices.lstrip("-").isdigit() else args.devices
    for phase in args.phases.split(","):  # kind-strategy[-precision]: trainer-ddp, fabric-fsdp, trainer-fsdp-bf16-mixed
        kind, strategy, *precision = phase.split("-", 2)
        args.phase = phase
        if kind == "trainer":
            facts = _trainer(args, strategy, args.out, *precision)
        else:
            facts = _fabric(args, strategy, args.out)
        with open(os.path.join(args.out, f"{phase}-rank{facts['global_rank']}.json"), "w") as f:
            json.dump(facts, f)


if __name__ == "__main__":
    main()
