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
