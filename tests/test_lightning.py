"""PyTorch Lightning and Fabric on vnpu through torch_vnpu.integrations.lightning (switched on by importing
lightning), against the same training on the CPU; two processes (Lightning's own launcher, vccl) against one
process training the same global batch."""
import json
import os
import signal
import subprocess
import sys
import warnings

import pytest
import torch

L = pytest.importorskip("lightning")
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy  # noqa: E402
from lightning.pytorch.utilities.exceptions import MisconfigurationException  # noqa: E402

import torch_vnpu.integrations.lightning as lightning_vnpu  # noqa: E402

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lightning_job.py")
sys.path.insert(0, os.path.dirname(JOB))
from lightning_job import Regressor, loader as _loader  # noqa: E402


def _fit(tmp_path=None, data=None, **kwargs):
    """One process, 5 AdamW steps on batches of 8. devices=1 unless given: devices="auto" is every vnpu device
    (two here), which would make Lightning start this process again (DDP launcher)."""
    kwargs.setdefault("devices", 1)
    model = Regressor()
    trainer = L.Trainer(max_steps=5, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's tips about num_workers, litlogger
        trainer.fit(model, data or _loader())
    return trainer, model


def test_adapter_switched_on_by_import():
    assert lightning_vnpu.is_enabled()
    assert "vnpu" in L.pytorch.accelerators.AcceleratorRegistry
    assert "vnpu" in L.fabric.accelerators.ACCELERATOR_REGISTRY


def test_trainer_vnpu_and_auto_match_cpu():
    cpu_trainer, cpu = _fit(accelerator="cpu")
    trainer, vnpu = _fit(accelerator="vnpu", devices=1)
    auto_trainer, auto = _fit()  # accelerator="auto", devices=1
    assert cpu_trainer.strategy.root_device.type == "cpu" and cpu.devices_seen == {"cpu"}
    for t, m in ((trainer, vnpu), (auto_trainer, auto)):
        assert isinstance(t.strategy, SingleDeviceStrategy) and t.strategy.root_device == torch.device("vnpu", 0)
        assert type(t.accelerator).__name__ == "VNPUAccelerator"
        assert m.devices_seen == {"vnpu"} and m.state_devices == {"vnpu"}  # params, batches, AdamW state
        assert m.losses == cpu.losses  # fp32, the same kernels: bitwise
    assert len(cpu.losses) == 5 and cpu.losses[-1] < cpu.losses[0]


def test_banner_says_vnpu_is_available_and_used(caplog):
    import logging

    for accelerator, used in (("vnpu", True), ("cpu", False)):
        caplog.clear()
        with caplog.at_level(logging.INFO):
            L.Trainer(accelerator=accelerator, devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False)
        lines = [r.getMessage() for r in caplog.records]
        assert f"VNPU available: True (vnpu), used: {used}" in lines, lines
        assert any(line.startswith("GPU available: False") for line in lines)  # Lightning's own lines stay


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


def test_devices_auto_is_every_visible_device(monkeypatch):
    # As CUDAAccelerator: devices="auto" is every visible device (VNPU_DEVICE_COUNT / VNPU_VISIBLE_DEVICES), one
    # inside an interactive session (where Lightning would fork processes after the device was initialized).
    count = torch.vnpu.device_count()
    assert count >= 2  # the default VNPU_DEVICE_COUNT
    every = [torch.device("vnpu", i) for i in range(count)]
    for trainer in (L.Trainer(accelerator="vnpu", logger=False), L.Trainer(logger=False)):  # devices="auto"
        assert isinstance(trainer.strategy, DDPStrategy) and trainer.strategy.parallel_devices == every
        assert trainer.num_devices == count
    fabric = L.Fabric()  # accelerator="auto", devices="auto"
    assert type(fabric.strategy).__name__ == "DDPStrategy" and fabric.strategy.parallel_devices == every
    import lightning.fabric.connector as fabric_connector
    import lightning.pytorch.trainer.connectors.accelerator_connector as trainer_connector

    monkeypatch.setattr(trainer_connector, "_IS_INTERACTIVE", True)
    monkeypatch.setattr(fabric_connector, "_IS_INTERACTIVE", True)
    trainer = L.Trainer(accelerator="vnpu", logger=False)
    assert isinstance(trainer.strategy, SingleDeviceStrategy) and trainer.strategy.root_device == every[0]
    assert L.Fabric(accelerator="vnpu").device == every[0]
    # An explicit devices=N keeps N (Lightning then uses its fork launcher in a notebook, as for CUDA).
    assert L.Trainer(accelerator="vnpu", devices=2, logger=False).num_devices == 2


def _launch(out, *args, timeout: float = 300) -> str:
    """Runs lightning_job.py as a user would (``python script.py``); Lightning's launcher starts rank 1. The
    whole process group is killed on timeout (rank 1 is rank 0's child)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_PORT", "MASTER_ADDR")}
    proc = subprocess.Popen([sys.executable, JOB, "--out", str(out), *args], cwd=out, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)  # until rank 1, which shares the pipes, exits too
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"lightning_job.py {' '.join(args)} did not finish within {timeout} s:\n{stderr[-4000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # nothing of the job may outlive the test
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, stdout[-2000:] + stderr[-6000:]
    return stdout


@pytest.mark.slow
def test_two_processes_ddp_and_fsdp_match_one_process(tmp_path):
    """Trainer(devices=2, strategy="ddp" / "fsdp", also with precision="bf16-mixed") and Fabric(devices=2,
    strategy="ddp" / FSDP) on vnpu:0 and vnpu:1,
    each rank with batches of 4, against one CPU process with the same batches of 8 (the samples of rank r are
    the r-th, (r+2)-th, ... of the Trainer's shuffled order / of the data for Fabric; DDP averages the
    gradients, FSDP reduce-scatters their average)."""
    references = {}
    for kind, data in (("trainer", _loader(shuffled_as_trainer=True)), ("fabric", _loader())):
        _, model = _fit(accelerator="cpu", data=data)
        references[kind] = torch.tensor(model.losses), {k: v.cpu() for k, v in model.state_dict().items()}
    initial = Regressor().state_dict()
    phases = ("trainer-ddp", "trainer-fsdp", "fabric-ddp", "fabric-fsdp", "trainer-fsdp-bf16-mixed")
    _launch(tmp_path, "--accelerator", "vnpu", "--devices", "2", "--batch-size", "4", "--phases", ",".join(phases))
    expected_strategy = {"trainer-ddp": "DDPStrategy", "trainer-fsdp": "FSDPStrategy", "fabric-ddp": "DDPStrategy",
                         "fabric-fsdp": "FSDPStrategy", "trainer-fsdp-bf16-mixed": "FSDPStrategy"}
    for phase in phases:
        ref_losses, ref_params = references[phase.split("-")[0]]
        ranks = [json.loads((tmp_path / f"{phase}-rank{r}.json").read_text()) for r in (0, 1)]
        for r, facts in enumerate(ranks):
            assert facts["strategy"] == expected_strategy[phase] and facts["world_size"] == 2, (phase, facts)
            assert facts["backend"] == "vccl" and facts["root_device"] == f"vnpu:{r}", (phase, facts)
            assert facts["param_devices"] == [f"vnpu:{r}"] and facts["batch_devices"] == [f"vnpu:{r}"], (phase, facts)
            if "state_devices" in facts:
                assert facts["state_devices"] == ["vnpu"], (phase, facts)
        # The mean of the two ranks' losses is the full batch's loss; fp32, another summation order. bf16 mixed
        # (FSDP's bf16 parameters, autocast on vnpu) vs fp32: measured 2.4e-3 (losses), 7.1e-4 (parameters).
        bf16 = phase.endswith("bf16-mixed")
        if bf16:
            for facts in ranks:
                assert facts["precision_plugin"] == "VNPUFSDPPrecision" and facts["dtypes"] == ["torch.bfloat16"]
        rtol, atol = (3e-2, 3e-3) if bf16 else (1e-5, 1e-5)
        mean = (torch.tensor(ranks[0]["losses"]) + torch.tensor(ranks[1]["losses"])) / 2
        torch.testing.assert_close(mean, ref_losses, rtol=rtol, atol=0, msg=phase)
        params = torch.load(tmp_path / f"{phase}.pt")
        assert params.keys() == ref_params.keys(), phase
        assert max((v - initial[k]).abs().max() for k, v in params.items()) > 1e-2  # trained
        for k, v in params.items():
            assert v.device.type == "cpu" and v.dtype == torch.float32
            torch.testing.assert_close(v, ref_params[k], rtol=0, atol=atol, msg=f"{phase} {k}")


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
        t = L.Trainer(max_steps=8, accelerator=acc, devices=1, logger=False, enable_checkpointing=False,
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
        fabric = L.Fabric(**kwargs, devices=1)
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
    fabric, model, losses, _ = run()  # accelerator="auto", devices=1
    assert fabric.device == torch.device("vnpu", 0)
    assert {p.device.type for p in model.parameters()} == {"vnpu"}
    assert losses == cpu_losses
    fabric, _, bf16_losses, dtypes = run(accelerator="vnpu", precision="bf16-mixed")
    assert fabric._precision.device == "vnpu" and dtypes == {torch.bfloat16}
    torch.testing.assert_close(torch.tensor(bf16_losses), torch.tensor(cpu_losses), rtol=3e-2, atol=0)


def test_vnpu_accelerator_without_devices_says_not_available(tmp_path):
    # No vnpu device visible: accelerator="vnpu" gets Lightning's own "not available" error, worded as the one it
    # gives for accelerator="cuda" without a GPU (the oracle, asked in the same process); "auto" trains on the CPU.
    code = """
import lightning as L
for kind in ("Trainer", "Fabric"):
    for acc in ("cuda", "vnpu"):
        try:
            getattr(L, kind)(accelerator=acc, devices=1)
        except Exception as e:
            print(f"{kind} {acc} {type(e).__name__}: {e}")
print("auto", L.Trainer(devices=1, logger=False).strategy.root_device, L.Fabric(devices=1).device)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=dict(os.environ, VNPU_VISIBLE_DEVICES="", PYTHONWARNINGS="ignore"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    *errors, auto = proc.stdout.strip().splitlines()
    messages = {}
    for line in errors:
        kind, acc, message = line.split(" ", 2)
        messages[kind, acc] = message
    for kind in ("Trainer", "Fabric"):
        cuda, vnpu = messages[kind, "cuda"], messages[kind, "vnpu"]
        assert "`CUDAAccelerator` can not run on your system since the accelerator is not available" in cuda
        assert vnpu == cuda.replace("CUDAAccelerator", "VNPUAccelerator"), (cuda, vnpu)
        assert "invalid accelerator name" not in vnpu
    assert auto == "auto cpu cpu"
