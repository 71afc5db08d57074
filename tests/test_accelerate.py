"""accelerate on vnpu through torch_vnpu.integrations.huggingface: device choice, training parity with CPU,
fp16 GradScaler on the device, and accelerate's own bundled test script."""
import os
import subprocess
import sys

import pytest
import torch

accelerate = pytest.importorskip("accelerate")
from accelerate import Accelerator  # noqa: E402
from accelerate.state import AcceleratorState  # noqa: E402

import torch_vnpu.integrations.huggingface as hf_vnpu  # noqa: E402


def test_device_selection_follows_adapter_and_cpu_flag(monkeypatch):
    monkeypatch.delenv("ACCELERATE_TORCH_DEVICE", raising=False)  # accelerate's own override would win
    AcceleratorState._reset_state(reset_partial_state=True)
    # `import accelerate` above switched the adapter on by itself (torch_vnpu.integrations._autoload).
    assert hf_vnpu.is_enabled() and "accelerate.state.PartialState.default_device" in hf_vnpu.patched_names()
    assert Accelerator().device.type == "vnpu"
    AcceleratorState._reset_state(reset_partial_state=True)
    hf_vnpu.disable()
    assert Accelerator().device.type == "cpu"  # accelerate 1.15 alone does not know vnpu
    AcceleratorState._reset_state(reset_partial_state=True)
    with hf_vnpu.enabled() as device:
        assert device == torch.device("vnpu")
        assert Accelerator().device.type == "vnpu"
        AcceleratorState._reset_state(reset_partial_state=True)
        assert Accelerator(cpu=True).device.type == "cpu"  # an explicit CPU request still wins
        AcceleratorState._reset_state(reset_partial_state=True)
    assert not hf_vnpu.is_enabled() and hf_vnpu.patched_names() == []
    assert Accelerator().device.type == "cpu"  # disable() restored accelerate
    AcceleratorState._reset_state(reset_partial_state=True)
    hf_vnpu.enable()  # as the rest of the session had it


def _train(cpu: bool, steps: int = 6):
    """A small MLP regression trained with Accelerator.prepare / backward / step.

    Returns (losses, accelerator.device, prepared model, prepared optimizer)."""
    torch.manual_seed(0)
    x = torch.randn(48, 16)
    y = x @ torch.randn(16, 4) + 0.1 * torch.randn(48, 4)
    dataset = torch.utils.data.TensorDataset(x, y)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, shuffle=False)
    accelerator = Accelerator(cpu=cpu)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for step, (xb, yb) in enumerate(loader):
        if step == steps:
            break
        assert xb.device.type == accelerator.device.type  # the prepared loader moves batches
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    device = accelerator.device
    AcceleratorState._reset_state(reset_partial_state=True)
    return losses, device, model, optimizer


def test_accelerator_training_matches_cpu(adapter):
    cpu_losses, cpu_device, cpu_model, _ = _train(cpu=True)
    losses, device, model, optimizer = _train(cpu=False)
    assert cpu_device.type == "cpu" and device.type == "vnpu"
    assert {p.device.type for p in model.parameters()} == {"vnpu"}
    state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    assert state and {t.device.type for t in state if t.dim() > 0} == {"vnpu"}  # exp_avg, exp_avg_sq
    # Same ATen CPU kernels on both devices: the losses are bitwise equal (tolerance kept at 1e-6 relative).
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses), rtol=1e-6, atol=0)
    for p, q in zip(model.parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-6, atol=1e-7)
    assert losses[-1] < losses[0]


def test_fp16_mixed_precision_uses_a_vnpu_grad_scaler(adapter):
    accelerator = Accelerator(mixed_precision="fp16")
    assert accelerator.device.type == "vnpu" and accelerator.native_amp
    assert isinstance(accelerator.scaler, torch.amp.GradScaler) and accelerator.scaler._device == "vnpu"
    torch.manual_seed(0)
    model = accelerator.prepare(torch.nn.Sequential(torch.nn.Linear(8, 2)))
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    inner = []
    model[0].register_forward_hook(lambda mod, args, output: inner.append(output.dtype))
    out = model(torch.randn(4, 8, device="vnpu"))
    assert inner == [torch.float16]  # forward runs under autocast("vnpu", float16) ...
    assert out.dtype == torch.float32  # ... and accelerate converts the outputs back to float32
    accelerator.backward(out.float().pow(2).mean())
    optimizer.step()
    assert accelerator.scaler._scale.device.type == "vnpu" and accelerator.scaler.get_scale() == 65536.0
    assert all(p.device.type == "vnpu" and p.dtype == torch.float32 for p in model.parameters())


def test_accelerate_bundled_test_script_passes_on_vnpu(tmp_path):
    """accelerate's own `accelerate test` script (test_utils/scripts/test_script.py), single process, run
    through `python -m torch_vnpu.integrations.huggingface` so the adapter is enabled in the child."""
    from accelerate.test_utils import path_in_accelerate_package

    script = path_in_accelerate_package("test_utils", "scripts", "test_script.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    env["HF_HUB_OFFLINE"] = "1"
    r = subprocess.run(
        [sys.executable, "-m", "torch_vnpu.integrations.huggingface", str(script)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "Device: vnpu" in out
    for section in ("All rng are properly synched.", "Shuffled central dataloader passing.",
                    "Training yielded the same results on one CPU or distributed setup with batch split.",
                    "BF16 training check.", "FP16 training check.", "**Test reinstantiated state**"):
        assert section in out, section


def test_runner_module_form_enables_the_adapter(tmp_path):
    (tmp_path / "probe_mod.py").write_text(
        "import sys\nfrom accelerate import Accelerator\nprint('device', Accelerator().device, sys.argv[1:])\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    env["PYTHONPATH"] = str(tmp_path)
    r = subprocess.run([sys.executable, "-m", "torch_vnpu.integrations.huggingface", "-m", "probe_mod", "x"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "device vnpu ['x']" in r.stdout, r.stdout + r.stderr
