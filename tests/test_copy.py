"""Tensor.copy_ across devices, views, dtypes and broadcasting, against CPU copy_ as the oracle."""
import pytest
import torch

DEV = "vnpu"


def _base(shape=(5, 8), dtype=torch.float32, offset=0.0):
    return (torch.arange(int(torch.tensor(shape).prod())).reshape(shape).to(dtype) + offset)


# Equal-strided non-dense views and other partial views: (name, view function).
VIEWS = [
    ("cols_step2", lambda t: t[:, ::2]),
    ("rows_step2", lambda t: t[::2]),
    ("inner_block", lambda t: t[1:4, 2:7]),
    ("col", lambda t: t[:, 3]),
    ("diag", lambda t: t.diagonal()),
    ("transposed_block", lambda t: t[1:4, 2:7].t()),
    ("step3_offset", lambda t: t[1:, 1::3]),
]


def _expected_after_copy(dst_cpu, src_cpu, view):
    ref = dst_cpu.clone()
    view(ref).copy_(view(src_cpu))
    return ref


@pytest.mark.parametrize("name,view", VIEWS, ids=[v[0] for v in VIEWS])
def test_cpu_to_vnpu_strided_view(name, view):
    dst_cpu = torch.full((5, 8), -1.0)
    src = _base()
    dst = dst_cpu.to(DEV)
    view(dst).copy_(view(src))
    assert torch.equal(dst.cpu(), _expected_after_copy(dst_cpu, src, view))


@pytest.mark.parametrize("name,view", VIEWS, ids=[v[0] for v in VIEWS])
def test_vnpu_to_cpu_strided_view(name, view):
    dst = torch.full((5, 8), -1.0)
    src_cpu = _base()
    src = src_cpu.to(DEV)
    expected = _expected_after_copy(dst, src_cpu, view)
    view(dst).copy_(view(src))
    assert torch.equal(dst, expected)


@pytest.mark.parametrize("name,view", VIEWS, ids=[v[0] for v in VIEWS])
@pytest.mark.parametrize("src_dev,dst_dev", [("vnpu:0", "vnpu:1"), ("vnpu:1", "vnpu:0"), ("vnpu:0", "vnpu:0")])
def test_vnpu_to_vnpu_strided_view(name, view, src_dev, dst_dev):
    dst_cpu = torch.full((5, 8), -1.0)
    src_cpu = _base()
    dst = dst_cpu.to(dst_dev)
    src = src_cpu.to(src_dev)
    view(dst).copy_(view(src))
    assert dst.device == torch.device(dst_dev)
    assert torch.equal(dst.cpu(), _expected_after_copy(dst_cpu, src_cpu, view))
    assert torch.equal(src.cpu(), src_cpu), "source must be untouched"


def test_cross_device_copy_with_different_strides():
    # dst is a transposed view (strides differ from the source).
    src_cpu = _base((4, 6))
    dst = torch.zeros(6, 4, device="vnpu:1").t()
    dst.copy_(src_cpu.to("vnpu:0"))
    assert torch.equal(dst.cpu(), src_cpu)
    dst2 = torch.zeros(6, 4).t()
    dst2.copy_(src_cpu.to(DEV)[:, :])
    assert torch.equal(dst2, src_cpu)
    dst3 = torch.zeros(6, 4, device=DEV).t()
    dst3.copy_(src_cpu)
    assert torch.equal(dst3.cpu(), src_cpu)


def test_3d_permuted_and_sliced_views_across_devices():
    src_cpu = _base((3, 4, 5))
    for s_dev, d_dev in [("cpu", "vnpu:0"), ("vnpu:0", "cpu"), ("vnpu:0", "vnpu:1")]:
        dst_cpu = torch.full((5, 4, 6), -7.0)
        ref = dst_cpu.clone()
        ref[:, ::2, 1::2].copy_(src_cpu.permute(2, 1, 0)[:, ::2, :3])
        dst = dst_cpu.to(d_dev)
        dst[:, ::2, 1::2].copy_(src_cpu.to(s_dev).permute(2, 1, 0)[:, ::2, :3])
        assert torch.equal(dst.cpu(), ref), (s_dev, d_dev)


DTYPE_PAIRS = [
    (torch.float32, torch.float16),
    (torch.float32, torch.bfloat16),
    (torch.float64, torch.float32),
    (torch.float32, torch.int32),
    (torch.int64, torch.float32),
    (torch.int32, torch.int8),
    (torch.float32, torch.bool),
    (torch.bool, torch.float32),
    (torch.float32, torch.complex64),
    (torch.complex128, torch.complex64),
    (torch.uint8, torch.int64),
]


@pytest.mark.parametrize("src_dtype,dst_dtype", DTYPE_PAIRS, ids=[f"{a}->{b}".replace("torch.", "")
                                                                   for a, b in DTYPE_PAIRS])
@pytest.mark.parametrize("route", ["cpu->vnpu", "vnpu->cpu", "vnpu->vnpu", "vnpu0->vnpu1"])
def test_dtype_converting_copy(src_dtype, dst_dtype, route):
    torch.manual_seed(0)
    src_cpu = (torch.randn(6, 7) * 50).to(src_dtype) if src_dtype != torch.bool else torch.randn(6, 7) > 0
    if src_dtype.is_complex:
        src_cpu = torch.complex(torch.randn(6, 7), torch.randn(6, 7)).to(src_dtype)
    ref = torch.empty(6, 7, dtype=dst_dtype)
    ref.copy_(src_cpu)
    s_dev, d_dev = {"cpu->vnpu": ("cpu", "vnpu:0"), "vnpu->cpu": ("vnpu:0", "cpu"),
                    "vnpu->vnpu": ("vnpu:0", "vnpu:0"), "vnpu0->vnpu1": ("vnpu:0", "vnpu:1")}[route]
    dst = torch.empty(6, 7, dtype=dst_dtype, device=d_dev)
    dst.copy_(src_cpu.to(s_dev))
    assert dst.dtype == dst_dtype
    assert torch.equal(dst.cpu(), ref)


def test_dtype_converting_copy_into_strided_view():
    src_cpu = torch.randn(5, 4, dtype=torch.float64)
    dst_cpu = torch.zeros(5, 8, dtype=torch.float16)
    ref = dst_cpu.clone()
    ref[:, ::2].copy_(src_cpu)
    for s_dev, d_dev in [("cpu", DEV), (DEV, "cpu"), ("vnpu:0", "vnpu:1")]:
        dst = dst_cpu.to(d_dev)
        dst[:, ::2].copy_(src_cpu.to(s_dev))
        assert torch.equal(dst.cpu(), ref), (s_dev, d_dev)


@pytest.mark.parametrize("src_shape", [(), (1,), (8,), (5, 1), (1, 8)])
@pytest.mark.parametrize("route", ["cpu->vnpu", "vnpu->vnpu", "vnpu0->vnpu1", "vnpu->cpu"])
def test_broadcasting_copy(src_shape, route):
    src_cpu = torch.arange(int(torch.tensor(src_shape).prod().item()) if src_shape else 1,
                           dtype=torch.float32).reshape(src_shape) + 1
    ref = torch.zeros(5, 8)
    ref.copy_(src_cpu)
    s_dev, d_dev = {"cpu->vnpu": ("cpu", "vnpu:0"), "vnpu->cpu": ("vnpu:0", "cpu"),
                    "vnpu->vnpu": ("vnpu:0", "vnpu:0"), "vnpu0->vnpu1": ("vnpu:0", "vnpu:1")}[route]
    dst = torch.zeros(5, 8, device=d_dev)
    dst.copy_(src_cpu.to(s_dev))
    assert torch.equal(dst.cpu(), ref)


def test_broadcasting_copy_into_view_and_with_dtype_change():
    src = torch.tensor([1.5, -2.5, 3.5, 4.5], dtype=torch.float64)
    dst_cpu = torch.zeros(3, 8, dtype=torch.int32)
    ref = dst_cpu.clone()
    ref[:, 1::2].copy_(src)
    dst = dst_cpu.to(DEV)
    dst[:, 1::2].copy_(src.to(DEV))
    assert torch.equal(dst.cpu(), ref)


def test_broadcast_copy_rejects_incompatible_shape():
    dst = torch.zeros(5, 8, device=DEV)
    with pytest.raises(RuntimeError):
        dst.copy_(torch.zeros(3, 8))
    with pytest.raises(RuntimeError):
        dst.copy_(torch.zeros(3, 8, device=DEV))


def _complex_src():
    torch.manual_seed(1)
    return torch.complex(torch.randn(4, 6), torch.randn(4, 6))


@pytest.mark.parametrize("kind", ["conj", "neg", "conj_neg", "conj_strided"])
@pytest.mark.parametrize("route", ["cpu->vnpu", "vnpu->cpu", "vnpu->vnpu", "vnpu0->vnpu1"])
def test_copy_from_conj_and_neg_views(kind, route):
    s_dev, d_dev = {"cpu->vnpu": ("cpu", "vnpu:0"), "vnpu->cpu": ("vnpu:0", "cpu"),
                    "vnpu->vnpu": ("vnpu:0", "vnpu:0"), "vnpu0->vnpu1": ("vnpu:0", "vnpu:1")}[route]
    z_cpu = _complex_src()

    def make(z):
        if kind == "conj":
            return z.conj()
        if kind == "neg":
            return torch._neg_view(z)
        if kind == "conj_neg":
            return torch._neg_view(z.conj())
        return z.conj()[:, ::2]

    ref_src = make(z_cpu)
    src = make(z_cpu.to(s_dev))
    assert src.is_conj() == ref_src.is_conj() and src.is_neg() == ref_src.is_neg()
    expected = ref_src.resolve_conj().resolve_neg()
    dst = torch.zeros(expected.shape, dtype=torch.complex64, device=d_dev)
    dst.copy_(src)
    assert not dst.is_conj() and not dst.is_neg()
    assert torch.equal(dst.cpu(), expected)


def test_conj_view_to_device_and_back():
    z = _complex_src()
    d = z.conj().to(DEV)
    assert torch.equal(d.resolve_conj().cpu(), z.conj().resolve_conj())
    assert torch.equal(d.cpu().resolve_conj(), z.conj().resolve_conj())
    back = z.to(DEV).conj().cpu()
    assert torch.equal(back.resolve_conj(), z.conj().resolve_conj())


def test_copy_into_conj_view_destination():
    z = _complex_src()
    src = torch.complex(torch.ones(4, 6), torch.full((4, 6), 2.0))
    ref = z.clone()
    ref.conj().copy_(src)
    d = z.to(DEV)
    d.conj().copy_(src.to(DEV))
    assert torch.equal(d.cpu(), ref)
    d2 = z.to(DEV)
    d2.conj().copy_(src)  # cpu -> vnpu into a conj view
    assert torch.equal(d2.cpu(), ref)


def test_self_overlapping_copy_within_device():
    # Copy between overlapping windows of one storage: same result as on CPU.
    a = torch.arange(10, dtype=torch.float32)
    ref = a.clone()
    ref[2:].copy_(ref[:8].clone())
    d = a.to(DEV)
    d[2:].copy_(d[:8].clone())
    assert torch.equal(d.cpu(), ref)


def test_copy_returns_self_and_is_stream_ordered():
    d = torch.zeros(1000, device=DEV)
    r = d.copy_(torch.ones(1000))
    assert r is d
    d.mul_(3)
    d[::2].copy_(torch.full((500,), 7.0, device="vnpu:1"))
    expected = torch.full((1000,), 3.0)
    expected[::2] = 7.0
    assert torch.equal(d.cpu(), expected)
