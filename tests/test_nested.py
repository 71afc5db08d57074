"""Nested tensors (torch.strided layout, NestedTensorPrivateUse1) on vnpu run ATen's NestedTensorCPU kernels, as
sparse ones run the sparse CPU kernels (csrc/ops/Sparse.cpp): values equal to CPU, results on vnpu.

Found by the compile break test of 2026-12-02: nn.TransformerEncoder in inference with a key padding mask takes
PyTorch's fast path, which packs the batch into a nested tensor on any supported device (PrivateUse1 included);
on vnpu that raised "Internal error: NestedTensorImpl doesn't support strides", eager and compiled.
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

DEV = "vnpu"


@pytest.mark.parametrize("grad_mode", ["no_grad", "inference_mode"])
def test_transformer_encoder_fast_path_with_padding_mask_equals_cpu(grad_mode):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2).eval()
    x = torch.randn(3, 7, 32)
    mask = torch.zeros(3, 7, dtype=torch.bool)
    mask[0, 5:] = True
    mask[2, 3:] = True  # padded positions; the nested path returns zeros there
    ctx = torch.no_grad if grad_mode == "no_grad" else torch.inference_mode
    with ctx():
        ref = encoder(x, src_key_padding_mask=mask)
        out = encoder.to(DEV)(x.to(DEV), src_key_padding_mask=mask.to(DEV))
    assert out.device.type == DEV
    assert torch.equal(out.cpu(), ref)
    assert torch.equal(out.cpu()[2, 3:], torch.zeros(4, 32))


def test_nested_tensor_ops_equal_cpu_and_stay_on_vnpu():
    torch.manual_seed(0)
    parts = [torch.randn(2, 8), torch.randn(5, 8), torch.randn(1, 8)]
    w, b = torch.randn(6, 8), torch.randn(6)

    def run(device):
        nt = torch.nested.nested_tensor([p.to(device) for p in parts])
        y = F.linear(nt.relu() + 1, w.to(device), b.to(device))
        return nt, y, y.to_padded_tensor(-1.0)

    _, cpu_y, cpu_padded = run("cpu")
    nt, y, padded = run(DEV)
    assert nt.is_nested and nt.device.type == DEV and y.device.type == DEV and padded.device.type == DEV
    assert torch.equal(padded.cpu(), cpu_padded)
    for got, ref in zip(y.unbind(), cpu_y.unbind()):
        assert got.device.type == DEV
        assert torch.equal(got.cpu(), ref)


def test_nested_tensor_from_mask_is_a_vnpu_nested_tensor():
    x = torch.arange(24.0).view(2, 3, 4)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    nt = torch._nested_tensor_from_mask(x.to(DEV), mask.to(DEV))
    ref = torch._nested_tensor_from_mask(x, mask)
    assert nt.is_nested and nt.device.type == DEV
    assert torch.equal(nt.to_padded_tensor(0.0).cpu(), ref.to_padded_tensor(0.0))


def _parts():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(2, 8, generator=g), torch.randn(5, 8, generator=g), torch.randn(1, 8, generator=g)]


def test_nested_cpu_to_vnpu_and_back_keeps_values():
    # Before 2026-12-02: "Expected all tensors to be on the same device ... vnpu:0 and cpu!" (CUDA moves it).
    nc = torch.nested.nested_tensor(_parts())
    nv = nc.to(DEV)
    assert nv.is_nested and nv.device.type == DEV
    nc.unbind()[0].add_(1)  # a copy, not a view of the CPU buffer
    back = nv.to("cpu")
    assert back.device.type == "cpu"
    for got, ref in zip(back.unbind(), _parts()):
        assert torch.equal(got, ref)
    assert torch.equal(nc.to(DEV, torch.float64).cpu().to_padded_tensor(0.0),
                       nc.to(torch.float64).to_padded_tensor(0.0))


def test_as_nested_tensor_of_a_dense_vnpu_tensor():
    # torch.nested.as_nested_tensor(dense) views the buffer with CPU sizes/strides/offsets (as on CUDA).
    x = torch.randn(3, 4, 5)
    nt = torch.nested.as_nested_tensor(x.to(DEV))
    assert nt.is_nested and nt.device.type == DEV
    assert torch.equal(nt.to_padded_tensor(0.0).cpu(), torch.nested.as_nested_tensor(x).to_padded_tensor(0.0))
    # The nested metadata stays on the host, as CUDA's.
    assert nt._nested_tensor_size().device.type == "cpu"
    assert torch.equal(nt._nested_tensor_size(), torch.tensor([[4, 5]] * 3))


def test_backward_through_nested_vnpu_tensors_equals_cpu():
    # Before 2026-12-02: autograd's shape check (_nested_tensor_size) copied the metadata to vnpu and raised.
    w = torch.randn(6, 8)

    def run(device):
        nt = torch.nested.nested_tensor([p.to(device) for p in _parts()], requires_grad=True)
        wd = w.clone().to(device).requires_grad_()
        y = F.linear((nt * 2).sin(), wd)
        y.to_padded_tensor(0.0).sum().backward()
        return nt.grad, wd.grad

    (cg, cw), (vg, vw) = run("cpu"), run(DEV)
    assert vg.is_nested and vg.device.type == DEV and vw.device.type == DEV
    for got, ref in zip(vg.unbind(), cg.unbind()):
        assert torch.equal(got.cpu(), ref)
    assert torch.equal(vw.cpu(), cw)
