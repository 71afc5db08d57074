"""torch.Generator(device="vnpu"), the per-device default generators and their (seed, offset) state."""
import pytest
import torch
import torch.nn.functional as F

DEV = "vnpu"


def _gen(seed, device=DEV):
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def _draws(g, device=DEV):
    """A sequence of draws of different kinds, all from generator ``g`` (as CPU tensors)."""
    out = [
        torch.randn(257, device=device, generator=g),
        torch.rand(3, 5, device=device, generator=g),
        torch.randint(0, 1000, (64,), device=device, generator=g),
        torch.empty(33, device=device).normal_(2.0, 3.0, generator=g),
        torch.empty(40, device=device).bernoulli_(0.3, generator=g),
        torch.empty(17, device=device).uniform_(-1, 1, generator=g),
        torch.randperm(20, device=device, generator=g),
        torch.multinomial(torch.ones(10, device=device), 4, generator=g),
    ]
    return [t.cpu() for t in out]


def _assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_generator_device_and_state_format():
    g = _gen(3)
    assert g.device == torch.device("vnpu:0")
    s = g.get_state()
    assert s.dtype == torch.uint8
    assert s.device.type == "cpu"
    assert s.shape == (16,)
    assert g.initial_seed() == 3
    # Philox-style state: seed (uint64) then offset (uint64).
    assert s[:8].view(torch.int64).item() == 3
    assert s[8:].view(torch.int64).item() == 0


def test_generator_on_second_device():
    g = torch.Generator(device="vnpu:1")
    assert g.device == torch.device("vnpu:1")
    g.manual_seed(5)
    a = torch.randn(10, device="vnpu:1", generator=g)
    assert a.device == torch.device("vnpu:1")
    g.manual_seed(5)
    assert torch.equal(torch.randn(10, device="vnpu:1", generator=g).cpu(), a.cpu())


def test_same_seed_same_draws_different_seed_different_draws():
    a = _draws(_gen(1234))
    b = _draws(_gen(1234))
    c = _draws(_gen(1235))
    _assert_same(a, b)
    assert not torch.equal(a[0], c[0])
    assert not torch.equal(a[1], c[1])
    # Successive draws from one generator differ (the offset advances).
    g = _gen(7)
    x, y = torch.randn(100, device=DEV, generator=g), torch.randn(100, device=DEV, generator=g)
    assert not torch.equal(x.cpu(), y.cpu())


def test_get_state_set_state_reproduces_draws():
    g = _gen(42)
    torch.randn(1000, device=DEV, generator=g)  # advance
    state = g.get_state()
    first = _draws(g)
    assert not torch.equal(g.get_state(), state), "offset must advance after draws"
    g.set_state(state)
    _assert_same(_draws(g), first)
    # A state moved to another generator reproduces too.
    h = _gen(0)
    h.set_state(state)
    _assert_same(_draws(h), first)


def test_offset_advances_monotonically_and_selects_stream():
    g = _gen(11)
    offsets = []
    for _ in range(4):
        torch.rand(100, device=DEV, generator=g)
        offsets.append(g.get_state()[8:].view(torch.int64).item())
    assert offsets == sorted(offsets) and len(set(offsets)) == 4
    # Setting the offset by hand (as DTensor's RNG tracker does) selects the draws.
    def draw_at(offset):
        s = g.get_state().clone()
        s[:8] = torch.tensor([11], dtype=torch.int64).view(torch.uint8)
        s[8:] = torch.tensor([offset], dtype=torch.int64).view(torch.uint8)
        g.set_state(s)
        return torch.rand(50, device=DEV, generator=g).cpu()

    assert torch.equal(draw_at(0), draw_at(0))
    assert torch.equal(draw_at(1024), draw_at(1024))
    assert not torch.equal(draw_at(0), draw_at(1024))


def test_set_state_rejects_wrong_size():
    g = _gen(0)
    with pytest.raises(RuntimeError):
        g.set_state(torch.zeros(7, dtype=torch.uint8))


def _state(seed, offset):
    return torch.tensor([seed, offset], dtype=torch.int64).view(torch.uint8)


# Rejected states, each with the exception CUDA raises for it (at::detail::check_rng_state and the size
# check of CUDAGeneratorImpl::set_state): only a contiguous CPU torch.ByteTensor of the right size is a state.
_BAD_STATES = {
    "vnpu_tensor": (lambda: _state(5, 8).to(DEV), TypeError, "ByteTensor"),
    "float_tensor": (lambda: _state(5, 8).float(), TypeError, "ByteTensor"),
    "int64_tensor": (lambda: torch.tensor([5, 8]), TypeError, "ByteTensor"),
    "not_a_tensor": (lambda: [5, 0, 0, 0], TypeError, "ByteTensor"),
    "non_contiguous": (lambda: torch.zeros(32, dtype=torch.uint8)[::2], RuntimeError, "contiguous"),
    "too_short": (lambda: _state(5, 8)[:8], RuntimeError, "wrong size"),
    "offset_not_multiple_of_4": (lambda: _state(5, 6), RuntimeError, "multiple of 4"),
}


@pytest.mark.parametrize("case", list(_BAD_STATES))
@pytest.mark.parametrize("setter", ["generator", "set_rng_state", "set_rng_state_all"])
def test_bad_rng_state_is_rejected_before_any_change(case, setter):
    make, exc, match = _BAD_STATES[case]
    torch.vnpu.manual_seed_all(11)
    g = torch.vnpu.default_generators[0] if setter != "generator" else _gen(11)
    before = [g.get_state()] + torch.vnpu.get_rng_state_all()
    with pytest.raises(exc, match=match):
        if setter == "generator":
            g.set_state(make())
        elif setter == "set_rng_state":
            torch.vnpu.set_rng_state(make())
        else:  # a valid state for device 0, the bad one for device 1: device 0 must not change either
            torch.vnpu.set_rng_state_all([_state(42, 4), make()])
    after = [g.get_state()] + torch.vnpu.get_rng_state_all()
    assert all(torch.equal(a, b) for a, b in zip(before, after)), "a rejected state changed a generator"


def test_vnpu_state_tensor_is_rejected_even_with_queued_work():
    # The bytes of a vnpu tensor may not be written yet (queued work): CUDA rejects a cuda state, so do we.
    state = torch.vnpu.get_rng_state()
    torch.vnpu._sleep(50_000_000)  # 50 ms of queued work before the copy lands
    on_device = state.to(DEV, non_blocking=True)
    with pytest.raises(TypeError, match="ByteTensor"):
        torch.vnpu.set_rng_state(on_device)
    assert torch.equal(torch.vnpu.get_rng_state(), state)


@pytest.mark.parametrize("device", [9, -1, "vnpu:9", torch.device("vnpu", 2)])
def test_rng_functions_reject_invalid_device_with_the_usual_error(device):
    state = torch.vnpu.get_rng_state()
    for call in (lambda: torch.vnpu.set_rng_state(state, device=device),
                 lambda: torch.vnpu.get_rng_state(device)):
        with pytest.raises(RuntimeError, match="Invalid device ordinal"):
            call()
    with pytest.raises(RuntimeError, match="Invalid device ordinal"):
        torch.vnpu.set_rng_state_all([state] * (torch.vnpu.device_count() + 1))
    assert torch.equal(torch.vnpu.get_rng_state(), state)


def test_set_rng_state_all_applies_every_state():
    torch.vnpu.set_rng_state_all([_state(100 + i, 4 * i) for i in range(torch.vnpu.device_count())])
    for i, s in enumerate(torch.vnpu.get_rng_state_all()):
        assert s[:8].view(torch.int64).item() == 100 + i and s[8:].view(torch.int64).item() == 4 * i


def test_explicit_generator_does_not_touch_default_generator():
    torch.vnpu.manual_seed(5)
    before = torch.vnpu.get_rng_state()
    torch.randn(100, device=DEV, generator=_gen(1))
    assert torch.equal(torch.vnpu.get_rng_state(), before)


def test_cpu_generator_rejected_for_vnpu_draws():
    # As CUDA: "Expected a 'cuda' device type for generator but found 'cpu'".
    with pytest.raises(RuntimeError, match="vnpu"):
        torch.randn(3, device=DEV, generator=torch.Generator())


def test_global_manual_seed_seeds_vnpu():
    torch.manual_seed(123)
    a0 = torch.randn(64, device="vnpu:0").cpu()
    a1 = torch.randn(64, device="vnpu:1").cpu()
    torch.manual_seed(123)
    b0 = torch.randn(64, device="vnpu:0").cpu()
    b1 = torch.randn(64, device="vnpu:1").cpu()
    assert torch.equal(a0, b0)
    assert torch.equal(a1, b1)
    torch.manual_seed(124)
    assert not torch.equal(torch.randn(64, device="vnpu:0").cpu(), a0)
    assert torch.vnpu.initial_seed() == 124


def test_global_seed_reproduces_dropout():
    x = torch.ones(1000, device=DEV)
    torch.manual_seed(9)
    a = F.dropout(x, 0.5, training=True).cpu()
    torch.manual_seed(9)
    b = F.dropout(x, 0.5, training=True).cpu()
    assert torch.equal(a, b)
    vals = set(a.unique().tolist())
    assert vals <= {0.0, 2.0} and vals == {0.0, 2.0}
    torch.manual_seed(10)
    assert not torch.equal(F.dropout(x, 0.5, training=True).cpu(), a)


def test_vnpu_get_set_rng_state():
    torch.vnpu.manual_seed(77)
    s = torch.vnpu.get_rng_state()
    assert s.dtype == torch.uint8 and s.shape == (16,) and s.device.type == "cpu"
    a = torch.randn(100, device=DEV).cpu()
    b = torch.rand(10, device=DEV).cpu()
    torch.vnpu.set_rng_state(s)
    assert torch.equal(torch.randn(100, device=DEV).cpu(), a)
    assert torch.equal(torch.rand(10, device=DEV).cpu(), b)
    # Per-device state.
    states = torch.vnpu.get_rng_state_all()
    assert len(states) == torch.vnpu.device_count()
    c1 = torch.randn(8, device="vnpu:1").cpu()
    torch.vnpu.set_rng_state(states[1], 1)
    assert torch.equal(torch.randn(8, device="vnpu:1").cpu(), c1)


def test_vnpu_manual_seed_only_seeds_current_device():
    torch.vnpu.manual_seed_all(1)
    s1 = torch.vnpu.get_rng_state(1)
    torch.vnpu.manual_seed(2)  # current device is 0
    assert torch.vnpu.get_rng_state(0)[:8].view(torch.int64).item() == 2
    assert torch.equal(torch.vnpu.get_rng_state(1), s1)


def test_fork_rng_restores_vnpu_state():
    torch.manual_seed(0)
    with torch.random.fork_rng(devices=range(torch.vnpu.device_count()), device_type="vnpu"):
        inside = torch.randn(20, device=DEV).cpu()
    after = torch.randn(20, device=DEV).cpu()
    assert torch.equal(inside, after)


def test_default_generator_is_a_vnpu_generator():
    g = torch.vnpu.default_generators[1]
    assert isinstance(g, torch.Generator)
    assert g.device == torch.device("vnpu:1")


def test_normal_statistics():
    g = _gen(2024)
    x = torch.randn(100_000, device=DEV, generator=g).cpu().double()
    assert abs(x.mean().item()) < 0.02
    assert abs(x.std().item() - 1.0) < 0.02
    y = torch.empty(100_000, device=DEV).normal_(3.0, 0.5, generator=g).cpu().double()
    assert abs(y.mean().item() - 3.0) < 0.01
    assert abs(y.std().item() - 0.5) < 0.01


def test_uniform_bernoulli_randint_statistics():
    g = _gen(99)
    u = torch.rand(100_000, device=DEV, generator=g).cpu().double()
    assert u.min().item() >= 0.0 and u.max().item() < 1.0
    assert abs(u.mean().item() - 0.5) < 0.01
    b = torch.empty(100_000, device=DEV).bernoulli_(0.3, generator=g).cpu()
    assert set(b.unique().tolist()) == {0.0, 1.0}
    assert abs(b.mean().item() - 0.3) < 0.01
    r = torch.randint(3, 13, (100_000,), device=DEV, generator=g).cpu()
    assert r.min().item() == 3 and r.max().item() == 12
    counts = torch.bincount(r - 3, minlength=10).double() / r.numel()
    assert (counts - 0.1).abs().max().item() < 0.01
    p = torch.randperm(1000, device=DEV, generator=g).cpu()
    assert torch.equal(p.sort().values, torch.arange(1000))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_draw_dtypes(dtype):
    g = _gen(5)
    x = torch.randn(1000, device=DEV, dtype=dtype, generator=g)
    assert x.dtype == dtype and x.device.type == "vnpu"
    xc = x.cpu()
    assert torch.isfinite(xc).all()
    g.manual_seed(5)
    assert torch.equal(torch.randn(1000, device=DEV, dtype=dtype, generator=g).cpu(), xc)
