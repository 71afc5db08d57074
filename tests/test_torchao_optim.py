"""torchao's low-bit optimizers (AdamW8bit, AdamW4bit) stepping vnpu parameters.

Each step runs ``torch.compile(single_param_adam, fullgraph=True)`` over the parameter, its gradient and the
quantized state (tensor subclasses holding uint8 codes and per-block scales). Oracle: the same optimizer on
CPU parameters, i.e. Inductor's CPU kernels for the same graphs: parameters and quantized states must be
bitwise equal after every step.
"""
import pytest
import torch

torchao_optim = pytest.importorskip("torchao.optim")  # pinned in requirements-dev.txt


def train(optimizer_cls, device, steps=3):
    torch.manual_seed(0)
    # 64x64 weights (4096 values) get a quantized state; the 64-value biases a plain one (torchao's rule).
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 64)).to(device)
    opt = optimizer_cls(model.parameters(), lr=1e-2, weight_decay=0.01)
    g = torch.Generator().manual_seed(1)
    history = [[p.detach().to("cpu", copy=True) for p in model.parameters()]]
    for _ in range(steps):
        x = torch.randn(8, 32, generator=g).to(device)
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        history.append([p.detach().to("cpu", copy=True) for p in model.parameters()])
    return model, opt, history


@pytest.mark.parametrize("name", ["AdamW8bit", "AdamW4bit"])
def test_low_bit_adamw_on_vnpu_matches_cpu_bitwise(name):
    cls = getattr(torchao_optim, name)
    model_c, opt_c, hist_c = train(cls, "cpu")
    model_v, opt_v, hist_v = train(cls, "vnpu")
    for step, (pc, pv) in enumerate(zip(hist_c, hist_v)):
        for a, b in zip(pc, pv):
            assert torch.equal(a, b), f"step {step}: max diff {(a - b).abs().max().item()}"
    for before, after in zip(hist_v[0], hist_v[-1]):
        assert not torch.equal(before, after)  # every parameter was stepped

    # The quantized states live on vnpu and equal CPU's: codes (uint8) and scales.
    weight_v, weight_c = model_v[2].weight, model_c[2].weight
    quantized = 0
    for key in ("exp_avg", "exp_avg_sq"):
        sv, sc = opt_v.state[weight_v][key], opt_c.state[weight_c][key]
        assert type(sv) is type(sc) and type(sv).__name__.startswith("OptimState")
        assert sv.codes.device.type == "vnpu" and sv.codes.dtype == torch.uint8
        assert torch.equal(sv.codes.cpu(), sc.codes) and torch.equal(sv.scale.cpu(), sc.scale)
        assert torch.equal(sv.dequantize().cpu(), sc.dequantize())
        quantized += 1
    assert quantized == 2
    bias_state = opt_v.state[model_v[2].bias]["exp_avg"]
    assert type(bias_state) is torch.Tensor and bias_state.device.type == "vnpu"
