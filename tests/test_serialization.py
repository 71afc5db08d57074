"""torch.save / torch.load of vnpu tensors and state_dicts (checkpoints load on any device and back)."""
import pytest
import torch
import torch.nn as nn


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3), nn.BatchNorm1d(3))


def _cpu_reference_state():
    return {k: v.clone() for k, v in _net().state_dict().items()}


def _assert_state_equal(loaded, expected, device):
    assert set(loaded) == set(expected)
    for k, v in expected.items():
        got = loaded[k]
        assert got.device == torch.device(device), (k, got.device)
        assert got.dtype == v.dtype, k
        assert got.shape == v.shape, k
        assert torch.equal(got.cpu(), v), k


def _save_vnpu_state(path):
    net = _net().to("vnpu")
    # Touch the buffers on the device so the checkpoint holds device-computed values too.
    net.train()
    net(torch.randn(4, 6, device="vnpu"))
    sd = net.state_dict()
    expected = {k: v.cpu() for k, v in sd.items()}
    for v in sd.values():
        assert v.device == torch.device("vnpu:0")
    torch.save(sd, path)
    return expected


def test_vnpu_state_dict_loads_on_cpu(tmp_path):
    path = tmp_path / "vnpu.pt"
    expected = _save_vnpu_state(path)
    loaded = torch.load(path, map_location="cpu")
    _assert_state_equal(loaded, expected, "cpu")
    # And the cpu copy is usable by a cpu module.
    net = _net()
    net.load_state_dict(loaded)
    for k, v in net.state_dict().items():
        assert torch.equal(v, expected[k]), k


def test_vnpu_state_dict_loads_on_other_vnpu_device(tmp_path):
    assert torch.vnpu.device_count() >= 2
    path = tmp_path / "vnpu.pt"
    expected = _save_vnpu_state(path)
    loaded = torch.load(path, map_location="vnpu:1")
    _assert_state_equal(loaded, expected, "vnpu:1")


def test_vnpu_state_dict_loads_with_torch_device_map_location(tmp_path):
    path = tmp_path / "vnpu.pt"
    expected = _save_vnpu_state(path)
    loaded = torch.load(path, map_location=torch.device("vnpu", 1))
    _assert_state_equal(loaded, expected, "vnpu:1")
    loaded = torch.load(path, map_location={"vnpu:0": "vnpu:1"})
    _assert_state_equal(loaded, expected, "vnpu:1")


def test_cpu_checkpoint_loads_onto_vnpu(tmp_path):
    path = tmp_path / "cpu.pt"
    expected = _cpu_reference_state()
    torch.save(_net().state_dict(), path)
    loaded = torch.load(path, map_location="vnpu")
    # map_location="vnpu" means the current vnpu device (index 0 here), as "cuda" does.
    for k, v in loaded.items():
        assert v.device.type == "vnpu", k
        assert v.device.index == 0, k
        assert torch.equal(v.cpu(), expected[k]), k
    net = _net().to("vnpu")
    net.load_state_dict(loaded)
    out = net.eval()(torch.ones(2, 6, device="vnpu"))
    ref = _net().eval()(torch.ones(2, 6))
    torch.testing.assert_close(out.cpu(), ref)


def test_load_without_map_location_restores_vnpu0(tmp_path):
    path = tmp_path / "vnpu.pt"
    expected = _save_vnpu_state(path)
    loaded = torch.load(path)
    _assert_state_equal(loaded, expected, "vnpu:0")


def test_load_without_map_location_restores_vnpu1_tensor(tmp_path):
    path = tmp_path / "t1.pt"
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    torch.save(x.to("vnpu:1"), path)
    y = torch.load(path)
    assert y.device == torch.device("vnpu:1")
    assert torch.equal(y.cpu(), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool,
                                   torch.complex64])
def test_tensor_roundtrip_dtypes(tmp_path, dtype):
    path = tmp_path / "t.pt"
    x = (torch.randn(3, 5) * 4).to(dtype)
    torch.save(x.to("vnpu"), path)
    y = torch.load(path, map_location="cpu")
    assert y.dtype == dtype and y.device.type == "cpu"
    assert torch.equal(y, x)


def test_shared_and_view_tensors_keep_sharing_after_load(tmp_path):
    path = tmp_path / "shared.pt"
    base = torch.arange(24, dtype=torch.float32, device="vnpu").reshape(4, 6)
    sd = {
        "base": base,
        "alias": base,              # same tensor twice
        "row": base[1],             # view with storage offset
        "cols": base[:, ::2],       # non-contiguous view
        "t": base.t(),              # transposed view
    }
    torch.save(sd, path)
    for loc in (None, "cpu", "vnpu:1"):
        loaded = torch.load(path, map_location=loc)
        b = loaded["base"]
        dev = b.device
        assert dev == (torch.device("vnpu:0") if loc is None else torch.device(loc))
        # Values and view metadata are preserved.
        assert torch.equal(loaded["cols"].cpu(), base[:, ::2].cpu())
        assert loaded["cols"].stride() == (6, 2)
        assert loaded["row"].storage_offset() == 6
        assert loaded["t"].stride() == (1, 6)
        # Sharing: all entries live in one storage.
        ptr = b.untyped_storage().data_ptr()
        for k in ("alias", "row", "cols", "t"):
            assert loaded[k].device == dev, k
            assert loaded[k].untyped_storage().data_ptr() == ptr, k
        assert loaded["alias"] is b or loaded["alias"].data_ptr() == b.data_ptr()
        # A write through one view is seen by the others.
        b[1, 2] = -100.0
        assert loaded["row"][2].item() == -100.0
        assert loaded["cols"][1, 1].item() == -100.0
        assert loaded["t"][2, 1].item() == -100.0
        assert loaded["alias"][1, 2].item() == -100.0


def test_shared_parameters_in_module_state_dict(tmp_path):
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.out = nn.Linear(4, 10, bias=False)
            self.out.weight = self.emb.weight

    torch.manual_seed(0)
    m = Tied().to("vnpu")
    path = tmp_path / "tied.pt"
    torch.save(m.state_dict(), path)
    for loc in ("cpu", "vnpu:1", None):
        sd = torch.load(path, map_location=loc)
        assert sd["emb.weight"].data_ptr() == sd["out.weight"].data_ptr()
        assert torch.equal(sd["emb.weight"].cpu(), m.emb.weight.detach().cpu())


def test_module_to_vnpu_keeps_tied_parameters():
    # As on CUDA: Module.to(device) converts parameters in place (param.data = ...), so tied
    # parameters stay tied and the Parameter objects (held e.g. by an optimizer) are kept.
    emb = nn.Embedding(10, 4)
    lin = nn.Linear(4, 10, bias=False)
    lin.weight = emb.weight
    m = nn.ModuleDict({"emb": emb, "out": lin})
    w = emb.weight
    m.to("vnpu")
    assert m["emb"].weight.device.type == "vnpu"
    assert m["emb"].weight is w
    assert m["out"].weight is m["emb"].weight


def test_tied_state_dict_after_tying_on_device(tmp_path):
    m = nn.ModuleDict({"emb": nn.Embedding(10, 4).to("vnpu"), "out": nn.Linear(4, 10, bias=False)})
    m["out"].weight = m["emb"].weight  # tie on the device itself
    path = tmp_path / "tied2.pt"
    torch.save(m.state_dict(), path)
    for loc in ("cpu", "vnpu:1", None):
        sd = torch.load(path, map_location=loc)
        assert sd["emb.weight"].data_ptr() == sd["out.weight"].data_ptr()
        assert torch.equal(sd["out.weight"].cpu(), m["emb"].weight.detach().cpu())


def test_save_load_through_bytesio_and_whole_module():
    import io

    torch.manual_seed(0)
    net = nn.Linear(3, 2).to("vnpu")
    buf = io.BytesIO()
    torch.save(net, buf)
    buf.seek(0)
    net2 = torch.load(buf, weights_only=False)
    assert net2.weight.device == torch.device("vnpu:0")
    x = torch.randn(4, 3, device="vnpu")
    assert torch.equal(net2(x).cpu(), net(x).cpu())
