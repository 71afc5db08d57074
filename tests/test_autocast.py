"""torch.autocast("vnpu") follows CUDA's cast policy; GradScaler("vnpu") follows torch.amp's contract."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

DEV = "vnpu"
LOW = [torch.bfloat16, torch.float16]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        self.conv_out = self.conv(x)
        h = F.relu(self.conv_out)
        self.relu_out = h
        return self.fc(torch.flatten(h, 1))


def _net_and_input():
    torch.manual_seed(0)
    return Net(), torch.randn(2, 3, 6, 6)


def test_net_fp32_matches_cpu_without_autocast():
    # Prerequisite of the autocast tests: the same net in float32, forward and backward, equals CPU.
    net, x = _net_and_input()
    ref = net(x)
    ref.sum().backward()
    ref_grads = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    net = net.to(DEV)
    out = net(x.to(DEV))
    out.sum().backward()
    torch.testing.assert_close(out.cpu(), ref)
    for p, g in zip(net.parameters(), ref_grads):
        torch.testing.assert_close(p.grad.cpu(), g)


@pytest.mark.parametrize("dtype", LOW)
def test_conv_linear_outputs_in_autocast_dtype(dtype):
    net, x = _net_and_input()
    net = net.to(DEV)
    with torch.autocast(DEV, dtype=dtype):
        assert torch.is_autocast_enabled(DEV)
        assert torch.get_autocast_dtype(DEV) == dtype
        out = net(x.to(DEV))
    assert not torch.is_autocast_enabled(DEV)
    assert net.conv_out.dtype == dtype
    assert net.relu_out.dtype == dtype
    assert out.dtype == dtype
    assert out.device.type == "vnpu"
    # Parameters themselves are untouched.
    assert net.fc.weight.dtype == torch.float32


def test_bf16_values_match_cpu_autocast():
    net, x = _net_and_input()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = net(x)
    net_d = net.to(DEV)
    with torch.autocast(DEV, dtype=torch.bfloat16):
        out = net_d(x.to(DEV))
    assert ref.dtype == out.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu(), ref, rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", LOW)
def test_values_close_to_fp32(dtype):
    net, x = _net_and_input()
    ref = net(x)
    net_d = net.to(DEV)
    with torch.autocast(DEV, dtype=dtype):
        out = net_d(x.to(DEV))
    torch.testing.assert_close(out.float().cpu(), ref, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("dtype", LOW)
def test_fp32_policy_ops_return_float32(dtype):
    net, x = _net_and_input()
    net = net.to(DEV)
    target = torch.randn(2, 5, device=DEV)
    with torch.autocast(DEV, dtype=dtype):
        out = net(x.to(DEV))
        assert out.dtype == dtype
        # CUDA's fp32 / fp32_set_opt_dtype lists.
        assert torch.softmax(out, -1).dtype == torch.float32
        assert torch.log_softmax(out, -1).dtype == torch.float32
        assert out.sum().dtype == torch.float32
        assert out.sum(1).dtype == torch.float32
        assert torch.cumsum(out, 1).dtype == torch.float32
        assert F.mse_loss(out, target).dtype == torch.float32
        assert out.exp().dtype == torch.float32
        assert F.layer_norm(out, (5,)).dtype == torch.float32
        assert F.cross_entropy(out, torch.tensor([1, 3], device=DEV)).dtype == torch.float32
        assert F.binary_cross_entropy_with_logits(out, target.sigmoid()).dtype == torch.float32
        # Explicit dtype is honoured by fp32_set_opt_dtype ops.
        assert out.sum(dtype=torch.float64).dtype == torch.float64
        # Ops outside the lists keep the input dtype.
        assert F.relu(out).dtype == dtype
        assert (out * 2).dtype == dtype
    # Values of an fp32-policy op equal the op on the upcast input.
    torch.testing.assert_close(torch.softmax(out.float(), -1).cpu(),
                               torch.softmax(out.cpu().float(), -1))


@pytest.mark.parametrize("dtype", LOW)
def test_lower_precision_matmul_family_and_promote(dtype):
    a = torch.randn(4, 8, device=DEV)
    b = torch.randn(8, 3, device=DEV)
    c = torch.randn(4, 3, device=DEV)
    with torch.autocast(DEV, dtype=dtype):
        assert torch.mm(a, b).dtype == dtype
        assert torch.matmul(a, b).dtype == dtype
        assert (a @ b).dtype == dtype
        assert torch.addmm(c, a, b).dtype == dtype
        assert torch.bmm(a[None], b[None]).dtype == dtype
        assert torch.baddbmm(c[None], a[None], b[None]).dtype == dtype
        low = torch.mm(a, b)
        # promote: widest input type
        assert torch.addcmul(c, low, low).dtype == torch.float32
        assert torch.cat([c, low]).dtype == torch.float32
        assert torch.stack([c, low]).dtype == torch.float32
        # mixing through a lower-precision op casts everything down
        assert torch.mm(low, b.t().contiguous()[:3, :3]).dtype == dtype
        with torch.autocast(DEV, enabled=False):
            assert torch.mm(a, b).dtype == torch.float32
    torch.testing.assert_close(low.float().cpu(), (a.cpu() @ b.cpu()), rtol=3e-2, atol=3e-2)


def test_default_autocast_dtype_is_float16():
    # torch.autocast("cuda") without dtype uses float16.
    with torch.autocast(DEV):
        assert torch.get_autocast_dtype(DEV) == torch.float16
        y = F.linear(torch.randn(2, 3, device=DEV), torch.randn(4, 3, device=DEV))
    assert y.dtype == torch.float16


def test_autocast_does_not_affect_cpu_tensors():
    a, b = torch.randn(3, 3), torch.randn(3, 3)
    with torch.autocast(DEV, dtype=torch.bfloat16):
        assert torch.mm(a, b).dtype == torch.float32


def test_backward_under_autocast_gives_fp32_grads():
    net, x = _net_and_input()
    net = net.to(DEV)
    with torch.autocast(DEV, dtype=torch.bfloat16):
        loss = F.mse_loss(net(x.to(DEV)), torch.zeros(2, 5, device=DEV))
    assert loss.dtype == torch.float32
    loss.backward()
    for p in net.parameters():
        assert p.grad is not None
        assert p.grad.dtype == torch.float32
        assert p.grad.device.type == "vnpu"
        assert torch.isfinite(p.grad.cpu()).all()


def test_binary_cross_entropy_banned_under_autocast():
    p = torch.rand(4, device=DEV)
    t = torch.rand(4, device=DEV)
    with torch.autocast(DEV, dtype=torch.float16):
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(p, t)
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            nn.BCELoss()(p, t)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy_outside_autocast_matches_cpu(reduction):
    torch.manual_seed(0)
    p, t = torch.rand(4), torch.rand(4)
    out = F.binary_cross_entropy(p.to(DEV), t.to(DEV), reduction=reduction)
    torch.testing.assert_close(out.cpu(), F.binary_cross_entropy(p, t, reduction=reduction))


def test_ops_outside_policy_lists_run_unchanged_under_autocast():
    # Every op without an autocast rule falls through (as on CUDA): factories, views, copies, RNG.
    x = torch.arange(6, dtype=torch.float32, device=DEV)
    with torch.autocast(DEV, dtype=torch.bfloat16):
        y = x.unsqueeze(0).view(2, 3).t()
        assert y.dtype == torch.float32 and y.shape == (3, 2)
        z = torch.empty(6, device=DEV)
        z.copy_(x)
        r = torch.randn(5, device=DEV)
        s = x + 1
        assert r.dtype == torch.float32 and s.dtype == torch.float32
        h = x.half()
        assert h.dtype == torch.float16
    assert torch.equal(z.cpu(), torch.arange(6, dtype=torch.float32))
    assert torch.equal(s.cpu(), torch.arange(6, dtype=torch.float32) + 1)


def test_gradscaler_without_autocast():
    # GradScaler on its own (fp32 model): scale, unscale_, step, update on vnpu tensors.
    torch.manual_seed(0)
    lin = nn.Linear(3, 2)
    ref = nn.Linear(3, 2)
    ref.load_state_dict(lin.state_dict())
    lin = lin.to(DEV)
    x = torch.randn(4, 3)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(DEV, init_scale=256.0)
    loss = lin(x.to(DEV)).pow(2).sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 256.0
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    ref(x).pow(2).sum().backward()
    ref_opt.step()
    for a, b in zip(lin.parameters(), ref.parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach())


def test_gradscaler_step_fp16():
    net, x = _net_and_input()
    net = net.to(DEV)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(DEV)
    assert scaler.is_enabled()
    assert scaler.get_scale() == 65536.0  # init_scale = 2**16
    before = [p.detach().cpu().clone() for p in net.parameters()]

    with torch.autocast(DEV, dtype=torch.float16):
        out = net(x.to(DEV))
        loss = F.mse_loss(out, torch.zeros(2, 5, device=DEV))
    assert out.dtype == torch.float16 and loss.dtype == torch.float32
    scaled = scaler.scale(loss)
    assert scaled.device.type == "vnpu"
    torch.testing.assert_close(scaled.cpu(), loss.detach().cpu() * 65536.0)
    scaled.backward()
    scaler.unscale_(opt)
    # After unscale_, grads equal the fp32 gradient of the unscaled loss.
    grads = [p.grad.detach().cpu().clone() for p in net.parameters()]
    ref_net, _ = _net_and_input()
    with torch.autocast("cpu", dtype=torch.float16):
        ref_loss = F.mse_loss(ref_net(x), torch.zeros(2, 5))
    ref_loss.backward()
    for g, p in zip(grads, ref_net.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=5e-2, atol=5e-3)
    scaler.step(opt)
    scaler.update()
    after = [p.detach().cpu() for p in net.parameters()]
    assert all(not torch.equal(a, b) for a, b in zip(before, after)), "all parameters should change"
    for b, g, a in zip(before, grads, after):
        torch.testing.assert_close(a, b - 0.1 * g)
    # Finite grads and growth_interval (2000) not reached: the scale is unchanged.
    assert scaler.get_scale() == 65536.0
    assert scaler._scale.device.type == "vnpu"


def test_gradscaler_skips_step_and_backs_off_on_inf():
    torch.manual_seed(0)
    lin = nn.Linear(3, 1).to(DEV)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(DEV, init_scale=1024.0, growth_interval=1)
    before = [p.detach().cpu().clone() for p in lin.parameters()]
    with torch.autocast(DEV, dtype=torch.float16):
        loss = lin(torch.randn(4, 3, device=DEV)).float().sum()
    scaler.scale(loss).backward()
    lin.weight.grad[0, 0] = float("inf")
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 512.0  # backoff_factor 0.5
    for b, p in zip(before, lin.parameters()):
        assert torch.equal(p.detach().cpu(), b), "step must be skipped on inf grads"

    # Next step with finite grads: applied, and with growth_interval=1 the scale doubles.
    opt.zero_grad()
    with torch.autocast(DEV, dtype=torch.float16):
        loss = lin(torch.randn(4, 3, device=DEV)).float().sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 1024.0
    assert any(not torch.equal(p.detach().cpu(), b) for b, p in zip(before, lin.parameters()))


def test_gradscaler_nan_in_fp16_forward_skips():
    lin = nn.Linear(2, 2).to(DEV)
    opt = torch.optim.SGD(lin.parameters(), lr=1.0)
    scaler = torch.amp.GradScaler(DEV, init_scale=4.0)
    w = lin.weight.detach().cpu().clone()
    with torch.autocast(DEV, dtype=torch.float16):
        loss = lin(torch.tensor([[float("nan"), 1.0]], device=DEV)).float().sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2.0
    assert torch.equal(lin.weight.detach().cpu(), w)
