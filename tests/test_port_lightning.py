"""Lightning scripts written for CUDA (``accelerator="gpu"`` / ``"cuda"``) under port mode train on vnpu exactly
as with ``accelerator="vnpu"`` (devices, strategy, precision), against the CPU run of tests/test_lightning.py's
module; outside port mode Lightning's own answer stands."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

L = pytest.importorskip("lightning")
from lightning.pytorch.utilities.exceptions import MisconfigurationException  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, "lightning_job.py")
sys.path.insert(0, HERE)
from lightning_job import Regressor, loader  # noqa: E402


def _cpu_run(data=None) -> Regressor:
    model = Regressor()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=5, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, data or loader())
    return model


def test_gpu_accelerator_outside_port_mode_is_lightnings():
    # No CUDA here and no port mode: Lightning's own error, unchanged by the adapter.
    with pytest.raises(MisconfigurationException, match="No supported gpu backend found"):
        L.Trainer(accelerator="gpu", logger=False)
    with pytest.raises(MisconfigurationException, match="`CUDAAccelerator` can not run on your system"):
        L.Trainer(accelerator="cuda", logger=False)


CHILD = r"""
import json, sys, warnings, torch
import torch_vnpu.port.cuda as port
import lightning as L
from lightning.pytorch.accelerators import CUDAAccelerator
sys.path.insert(0, sys.argv[1])
from lightning_job import Regressor, loader

def fit(**kwargs):
    model = Regressor()
    trainer = L.Trainer(max_steps=5, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, loader())
    plugin = trainer.precision_plugin
    return {"accelerator": type(trainer.accelerator).__name__, "strategy": type(trainer.strategy).__name__,
            "root_device": str(trainer.strategy.root_device), "losses": model.losses,
            "param_devices": sorted(model.param_devices), "batch_devices": sorted(model.batch_devices),
            "state_devices": sorted(model.state_devices), "dtypes": sorted({str(d) for d in model.dtypes}),
            "precision_device": getattr(plugin, "device", None),
            "scaler_device": getattr(getattr(plugin, "scaler", None), "_device", None)}

facts = {}
for name, acc in (("gpu", "gpu"), ("cuda", "cuda"), ("vnpu", "vnpu"), ("CUDAAccelerator", CUDAAccelerator())):
    facts[name] = fit(accelerator=acc, devices=1)
facts["gpu_bf16"] = fit(accelerator="gpu", devices=1, precision="bf16-mixed")
facts["vnpu_bf16"] = fit(accelerator="vnpu", devices=1, precision="bf16-mixed")
facts["cuda_fp16"] = fit(accelerator="cuda", devices=[1], precision="16-mixed")
t = L.Trainer(accelerator="gpu", devices=2, strategy="ddp", logger=False)
facts["ddp"] = [type(t.strategy).__name__, [str(d) for d in t.strategy.parallel_devices]]
t = L.Trainer(accelerator="cuda", devices=2, strategy="fsdp", logger=False)
facts["fsdp"] = [type(t.strategy).__name__, [str(d) for d in t.strategy.parallel_devices]]
f = L.Fabric(accelerator="gpu", devices=1, precision="bf16-mixed")
facts["fabric"] = [str(f.device), f._precision.device]
port.disable()
try:
    L.Trainer(accelerator="gpu", logger=False)
except Exception as e:
    facts["after_disable"] = f"{type(e).__name__}: {e}"
print(json.dumps(facts))
"""


def test_trainer_and_fabric_with_gpu_accelerator_under_port_mode(tmp_path):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD), HERE], capture_output=True, text=True,
                          timeout=300, cwd=str(tmp_path), env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    cpu = _cpu_run()
    vnpu = facts["vnpu"]
    assert vnpu["accelerator"] == "VNPUAccelerator" and vnpu["root_device"] == "vnpu:0"
    for name in ("gpu", "cuda", "CUDAAccelerator"):
        run = facts[name]
        assert run["accelerator"] == "VNPUAccelerator" and run["strategy"] == "SingleDeviceStrategy", (name, run)
        assert run["root_device"] == "vnpu:0" and run["param_devices"] == ["vnpu:0"], (name, run)
        assert run["batch_devices"] == ["vnpu:0"] and run["state_devices"] == ["vnpu"], (name, run)
        assert run["losses"] == vnpu["losses"] == cpu.losses, name  # fp32, the same kernels: bitwise
    bf16 = facts["gpu_bf16"]
    assert bf16["precision_device"] == "vnpu" and bf16["dtypes"] == ["torch.bfloat16"]
    assert bf16["losses"] == facts["vnpu_bf16"]["losses"]  # the same autocast as accelerator="vnpu"
    torch.testing.assert_close(torch.tensor(bf16["losses"]), torch.tensor(cpu.losses), rtol=3e-2, atol=0)
    fp16 = facts["cuda_fp16"]
    assert fp16["root_device"] == "vnpu:1" and fp16["param_devices"] == ["vnpu:1"]
    assert fp16["precision_device"] == "vnpu" and fp16["scaler_device"] == "vnpu" and fp16["dtypes"] == ["torch.float16"]
    assert facts["ddp"] == ["DDPStrategy", ["vnpu:0", "vnpu:1"]]
    assert facts["fsdp"] == ["FSDPStrategy", ["vnpu:0", "vnpu:1"]]
    assert facts["fabric"] == ["vnpu:0", "vnpu"]
    assert facts["after_disable"] == "MisconfigurationException: No supported gpu backend found!"


@pytest.mark.slow  # a two-process launch (~40-150 s), as test_lightning.py's; run by make test-slow
def test_two_processes_with_gpu_accelerator_under_port_run(tmp_path):
    """``python -m torch_vnpu.port.run lightning_job.py --accelerator gpu --devices 2``: Lightning's launcher starts
    rank 1 under port.run too; DDP over vccl on vnpu:0/vnpu:1 vs one CPU process with batches of 8."""
    reference = torch.tensor(_cpu_run(loader(shuffled_as_trainer=True)).losses)
    env = {k: v for k, v in os.environ.items()
           if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_PORT", "MASTER_ADDR")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch_vnpu.port.run", JOB, "--out", str(tmp_path), "--accelerator", "gpu",
         "--devices", "2", "--batch-size", "4", "--phases", "trainer-ddp"],
        cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        pytest.fail(f"port.run lightning_job.py did not finish within 300 s:\n{stderr[-4000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, stderr[-6000:]
    ranks = [json.loads((tmp_path / f"trainer-ddp-rank{r}.json").read_text()) for r in (0, 1)]
    for r, facts in enumerate(ranks):
        assert facts["strategy"] == "DDPStrategy" and facts["world_size"] == 2 and facts["backend"] == "vccl"
        assert facts["root_device"] == f"vnpu:{r}" and facts["param_devices"] == [f"vnpu:{r}"], facts
    mean = (torch.tensor(ranks[0]["losses"]) + torch.tensor(ranks[1]["losses"])) / 2
    torch.testing.assert_close(mean, reference, rtol=1e-5, atol=0)
