"""PyTorch Lightning and Fabric on vnpu through torch_vnpu.integrations.lightning (switched on by importing
lightning), against the same training on the CPU."""
import warnings

import pytest
import torch

L = pytest.importorskip("lightning")
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy  # noqa: E402
from lightning.pytorch.utilities.exceptions import MisconfigurationException  # noqa: E402

import torch_vnpu.integrations.lightning as lightning_vnpu  # noqa: E402


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
        self.losses, self.dtypes, self.devices_seen, self.state_devices = [], [], set(), set()

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self.net(x)
        self.dtypes.append(out.dtype)
        self.devices_seen |= {p.device.type for p in self.parameters()} | {x.device.type}
        opt_state = self.optimizers().optimizer.state.values()  # AdamW's exp_avg, exp_avg_sq (after a step)
        self.state_devices |= {v.device.type for st in opt_state for v in st.values() if torch.is_tensor(v) and v.dim()}
        loss = torch.nn.functional.mse_loss(out.float(), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def _loader():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 8, generator=g)  # 5 batches: one epoch = the 5 steps of _fit
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True) + 0.1 * torch.randn(40, 1, generator=g))
    return torch.utils.data.DataLoader(data, batch_size=8)


def _fit(tmp_path=None, **kwargs):
    model = Regressor()
    trainer = L.Trainer(max_steps=5, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's tips about num_workers, litlogger
        trainer.fit(model, _loader())
    return trainer, model


def test_adapter_switched_on_by_import():
    assert lightning_vnpu.is_enabled()
    assert "vnpu" in L.pytorch.accelerators.AcceleratorRegistry
    assert "vnpu" in L.fabric.accelerators.ACCELERATOR_REGISTRY


def test_trainer_vnpu_and_auto_match_cpu():
    cpu_trainer, cpu = _fit(accelerator="cpu")
    trainer, vnpu = _fit(accelerator="vnpu", devices=1)
    auto_trainer, auto = _fit()  # accelerator="auto", devices="auto"
    assert cpu_trainer.strategy.root_device.type == "cpu" and cpu.devices_seen == {"cpu"}
    for t, m in ((trainer, vnpu), (auto_trainer, auto)):
        assert isinstance(t.strategy, SingleDeviceStrategy) and t.strategy.root_device == torch.device("vnpu", 0)
        assert type(t.accelerator).__name__ == "VNPUAccelerator"
        assert m.devices_seen == {"vnpu"} and m.state_devices == {"vnpu"}  # params, batches, AdamW state
        assert m.losses == cpu.losses  # fp32, the same kernels: bitwise
    assert len(cpu.losses) == 5 and cpu.losses[-1] < cpu.losses[0]


def test_mixed_precision_autocasts_vnpu():
    _, cpu = _fit(accelerator="cpu")
    bf16_trainer, bf16 = _fit(accelerator="vnpu", precision="bf16-mixed")
    plugin = bf16_trainer.precision_plugin
    assert type(plugin).__name__ == "MixedPrecision" and plugin.device == "vnpu" and plugin.scaler is None
    assert set(bf16.dtypes) == {torch.bfloat16} and bf16.devices_seen == {"vnpu"}
    torch.testing.assert_close(torch.tensor(bf16.losses), torch.tensor(cpu.losses), rtol=3e-2, atol=0)
    fp16_trainer, fp16 = _fit(accelerator="vnpu", precision="16-mixed")
    scaler = fp16_trainer.precision_plugin.scaler
    assert isinstance(scaler, torch.amp.GradScaler) and scaler._device == "vnpu" and scaler.is_enabled()
    assert set(fp16.dtypes) == {torch.float16} and all(torch.isfinite(torch.tensor(fp16.losses)))


def test_devices_argument():
    trainer = L.Trainer(accelerator="vnpu", devices=2, logger=False)
    assert isinstance(trainer.strategy, DDPStrategy)
    assert trainer.strategy.parallel_devices == [torch.device("vnpu", 0), torch.device("vnpu", 1)]
    trainer = L.Trainer(accelerator="vnpu", devices=[1], logger=False)
    assert trainer.strategy.root_device == torch.device("vnpu", 1)
    with pytest.raises(MisconfigurationException, match="vnpu device"):
        L.Trainer(accelerator="vnpu", devices=torch.vnpu.device_count() + 1, logger=False)


def test_checkpoint_save_load_and_resume(tmp_path):
    trainer, model = _fit(tmp_path, accelerator="vnpu")
    path = tmp_path / "last.ckpt"
    trainer.save_checkpoint(path)
    restored = Regressor.load_from_checkpoint(path, map_location="vnpu")
    assert {p.device.type for p in restored.parameters()} == {"vnpu"}
    for p, q in zip(restored.parameters(), model.parameters()):
        assert torch.equal(p.cpu(), q.cpu())
    # Resuming (model, AdamW state, loop state) on vnpu continues exactly as the same resume on the CPU.
    resumed = {}
    for acc in ("vnpu", "cpu"):
        module = Regressor()
        t = L.Trainer(max_steps=8, accelerator=acc, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t.fit(module, _loader(), ckpt_path=str(path))
        assert module.state_devices == {acc}  # the restored optimizer state, during training (fit's teardown
        resumed[acc] = module                # moves model and optimizer state to the CPU, as for CUDA)
    assert resumed["vnpu"].devices_seen == {"vnpu"} and len(resumed["vnpu"].losses) == 3
    assert resumed["vnpu"].losses == resumed["cpu"].losses


def test_fabric_matches_cpu():
    def run(**kwargs):
        fabric = L.Fabric(**kwargs)
        losses, dtypes = [], set()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
        # Fabric casts the module's output back to float32: record the dtype inside the autocast region.
        model[0].register_forward_hook(lambda mod, args, out: dtypes.add(out.dtype))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model, optimizer = fabric.setup(model, optimizer)
        loader = fabric.setup_dataloaders(_loader())
        for x, y in loader:
            out = model(x)
            loss = torch.nn.functional.mse_loss(out.float(), y)
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        return fabric, model, losses, dtypes

    _, cpu_model, cpu_losses, _ = run(accelerator="cpu")
    fabric, model, losses, _ = run()  # accelerator="auto"
    assert fabric.device == torch.device("vnpu", 0)
    assert {p.device.type for p in model.parameters()} == {"vnpu"}
    assert losses == cpu_losses
    fabric, _, bf16_losses, dtypes = run(accelerator="vnpu", precision="bf16-mixed")
    assert fabric._precision.device == "vnpu" and dtypes == {torch.bfloat16}
    torch.testing.assert_close(torch.tensor(bf16_losses), torch.tensor(cpu_losses), rtol=3e-2, atol=0)
