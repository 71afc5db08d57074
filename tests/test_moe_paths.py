"""Ops on the path of mixture-of-experts layers run in stream order without synchronizing, as on CUDA, and equal
CPU: integer advanced indexing (`x[idx]`, tagged dynamic_output_shape in ATen because of boolean masks) and
`torch._grouped_mm` (a CompositeExplicitAutograd kernel that reads `offs` on the host). Before, both
synchronized the stream on every call: Mixtral's greedy decode took 4.5x the CPU's time
(benchmarks/hf_step.py). Also the Hugging Face adapter's patch 10 (MoE decoding keeps grouped_mm on vnpu)."""
import pytest
import torch

from torch_vnpu.testing.gate import Gate, open_all

DEV = "vnpu"


@pytest.fixture(autouse=True)
def _open_gates():
    yield
    open_all()


def _queued_behind_a_gate(fn, *args):
    """Run fn(*args) while the current stream is held: returns (result, stream still busy at return)."""
    with Gate() as g:
        g.block()
        out = fn(*args)
        busy = not torch.vnpu.current_stream().query()
    torch.vnpu.synchronize()
    return out, busy


@pytest.mark.parametrize("case", ["1d", "2d", "two_lists", "with_slice_and_none", "negative"])
def test_integer_indexing_is_queued_not_synchronized(case):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, 4, generator=g)
    idx = {
        "1d": (torch.tensor([4, 0, 4, 2]),),
        "2d": (torch.tensor([[3, 1], [0, 5]]),),
        "two_lists": (torch.tensor([1, 2, 5]), torch.tensor([0, 4, 4])),
        "with_slice_and_none": (slice(None), torch.tensor([[3, 1], [0, 0]])),
        "negative": (torch.tensor([-1, -6]),),
    }[case]
    dev_idx = tuple(i.to(DEV) if isinstance(i, torch.Tensor) else i for i in idx)
    xd = x.to(DEV)
    out, busy = _queued_behind_a_gate(lambda: xd[dev_idx])
    assert busy, "x[int_idx] waited for the stream"
    assert torch.equal(out.cpu(), x[idx])


def test_boolean_mask_indexing_still_synchronizes_and_matches_cpu():
    x = torch.arange(12.0).reshape(3, 4)
    mask = x.remainder(3) == 1
    assert torch.equal(x.to(DEV)[mask.to(DEV)].cpu(), x[mask])
    assert torch.equal(x.to(DEV)[mask.to(DEV).to(torch.uint8).bool()].cpu(), x[mask])


def test_out_of_range_integer_index_raises_at_the_next_synchronization():
    # As CUDA's device-side assert: the call may return; the error is sticky until a synchronization reports it.
    with pytest.raises((IndexError, RuntimeError), match="out of bounds|out of range"):
        torch.zeros(4, device=DEV)[torch.tensor([7], device=DEV)]
        torch.vnpu.synchronize()
    assert torch.equal((torch.ones(2, device=DEV) + 1).cpu(), torch.full((2,), 2.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shapes", ["2d_3d", "3d_3d", "2d_2d"])
def test_grouped_mm_is_queued_and_bitwise_equal_to_cpu(dtype, shapes):
    g = torch.Generator().manual_seed(1)
    if shapes == "2d_3d":  # MoE: tokens sorted by expert, one weight per expert, an empty group
        a, b = torch.randn(10, 64, generator=g), torch.randn(4, 64, 32, generator=g)
        offs = torch.tensor([3, 3, 7, 10], dtype=torch.int32)
    elif shapes == "3d_3d":
        a, b, offs = torch.randn(4, 5, 64, generator=g), torch.randn(4, 64, 32, generator=g), None
    else:
        a, b = torch.randn(8, 16, generator=g), torch.randn(16, 24, generator=g)
        offs = torch.tensor([8, 16], dtype=torch.int32)
    a, b = a.to(dtype), b.to(dtype)
    ref = torch._grouped_mm(a, b, offs=offs)
    dargs = (a.to(DEV), b.to(DEV))
    dofs = None if offs is None else offs.to(DEV)
    out, busy = _queued_behind_a_gate(lambda: torch._grouped_mm(*dargs, offs=dofs))
    assert busy, "_grouped_mm waited for the stream"
    assert out.stride() == ref.stride() and out.dtype == ref.dtype
    assert torch.equal(out.cpu(), ref)


def test_grouped_mm_backward_matches_cpu():
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(10, 16, generator=g), torch.randn(3, 16, 8, generator=g)
    offs, grad = torch.tensor([2, 6, 10], dtype=torch.int32), torch.randn(10, 8, generator=g)
    grads = []
    for dev in ("cpu", DEV):
        ad, bd = a.to(dev, copy=True).requires_grad_(), b.to(dev, copy=True).requires_grad_()
        (torch._grouped_mm(ad, bd, offs=offs.to(dev)) * grad.to(dev)).sum().backward()
        grads.append((ad.grad.cpu(), bd.grad.cpu()))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


def test_grouped_mm_bad_arguments_raise_cpus_errors_at_the_call():
    offs = torch.tensor([1, 3], dtype=torch.int32)
    for dev in ("cpu", DEV):
        with pytest.raises(RuntimeError, match="contraction dimension"):
            torch._grouped_mm(torch.randn(3, 4, device=dev), torch.randn(2, 5, 8, device=dev), offs=offs.to(dev))
        with pytest.raises(RuntimeError, match="int32"):
            torch._grouped_mm(torch.randn(3, 4, device=dev), torch.randn(2, 4, 8, device=dev), offs=offs.long().to(dev))
    with pytest.raises(RuntimeError, match="same device"):
        torch._grouped_mm(torch.randn(3, 4, device=DEV), torch.randn(2, 4, 8), offs=offs.to(DEV))
    assert torch.equal((torch.ones(2, device=DEV) * 3).cpu(), torch.full((2,), 3.0))


def test_mixtral_decode_keeps_grouped_mm_on_vnpu_and_generates_cpus_tokens():
    transformers = pytest.importorskip("transformers")
    import torch_vnpu.integrations.huggingface as hf

    cfg = transformers.MixtralConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2)
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(cfg).eval()
    ids = torch.randint(0, 100, (2, 5), generator=torch.Generator().manual_seed(0))
    seen = []
    experts = model.model.layers[0].mlp.experts
    orig_forward = type(experts).forward

    def spy(self, *args, **kwargs):
        seen.append(self.config._experts_implementation)
        return orig_forward(self, *args, **kwargs)

    kw = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
        model.to(DEV)
        type(experts).forward = spy
        try:
            with hf.enabled():
                assert "transformers.generation.utils.GenerationMixin._optimize_model_for_decode" in hf.patched_names()
                out = model.generate(ids.to(DEV), attention_mask=torch.ones_like(ids).to(DEV), **kw)
        finally:
            type(experts).forward = orig_forward
    assert seen and set(seen) == {"grouped_mm"}, seen  # transformers alone switches decoding to batched_mm
    assert torch.equal(out.cpu(), ref)
