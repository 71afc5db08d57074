"""Sparse layouts on vnpu (COO, CSR/CSC/BSR/BSC): every result is compared with the same computation on CPU
(the oracle). Ops run ATen's SparseCPU/SparseCsrCPU kernels on aliases of device memory (csrc/ops/Sparse.cpp)."""
import io
import warnings

import pytest
import torch

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta:UserWarning",
                                        "ignore:Sparse invariant checks are implicitly disabled:UserWarning")

DEV = "vnpu"


def _dense(seed=0, shape=(5, 6), density=0.4, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).to(dtype)
    return x * (torch.rand(shape, generator=g) < density)


def _uncoalesced_coo(dtype=torch.float32):
    # duplicate (0, 1) entries and unsorted indices
    i = torch.tensor([[1, 0, 0, 2, 1], [2, 1, 1, 0, 2]])
    v = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=dtype)
    return torch.sparse_coo_tensor(i, v, (3, 4))


def assert_same(vnpu, cpu):
    """vnpu result equals the CPU one: layout, dtype, shape, components and dense values."""
    assert vnpu.device.type == DEV, vnpu.device
    assert vnpu.layout == cpu.layout and vnpu.dtype == cpu.dtype and vnpu.shape == cpu.shape
    got = vnpu.cpu()
    assert got.device.type == "cpu" and got.layout == cpu.layout
    if cpu.layout == torch.sparse_coo:
        assert got.is_coalesced() == cpu.is_coalesced()
        assert got.sparse_dim() == cpu.sparse_dim() and got.dense_dim() == cpu.dense_dim()
        torch.testing.assert_close(got._indices(), cpu._indices(), rtol=0, atol=0)
        torch.testing.assert_close(got._values(), cpu._values(), rtol=0, atol=0)
    elif cpu.layout != torch.strided:
        for comp in ("crow_indices", "col_indices") if cpu.layout in (torch.sparse_csr, torch.sparse_bsr) \
                else ("ccol_indices", "row_indices"):
            torch.testing.assert_close(getattr(got, comp)(), getattr(cpu, comp)(), rtol=0, atol=0)
        torch.testing.assert_close(got.values(), cpu.values(), rtol=0, atol=0)
    torch.testing.assert_close(got.to_dense(), cpu.to_dense(), rtol=0, atol=0)


def fresh(t, dev):
    """A copy of `t` on `dev` (t.to("cpu") would return t itself, and requires_grad_() would then change t)."""
    return t.clone().to(dev)


def components_on_device(t):
    if t.layout == torch.sparse_coo:
        comps = [t._indices(), t._values()]
    elif t.layout in (torch.sparse_csr, torch.sparse_bsr):
        comps = [t.crow_indices(), t.col_indices(), t.values()]
    else:
        comps = [t.ccol_indices(), t.row_indices(), t.values()]
    return all(c.device == t.device and c.layout == torch.strided for c in comps)


# ---------------------------------------------------------------------------------------------- COO

def test_coo_creation_on_device():
    i = torch.tensor([[0, 1, 1], [2, 0, 2]])
    v = torch.tensor([3.0, 4.0, 5.0])
    cpu = torch.sparse_coo_tensor(i, v, (2, 3))
    dev = torch.sparse_coo_tensor(i, v, (2, 3), device=DEV)
    assert_same(dev, cpu)
    assert components_on_device(dev)
    # from device components, no device argument
    dev2 = torch.sparse_coo_tensor(i.to(DEV), v.to(DEV), (2, 3))
    assert_same(dev2, cpu)
    # size inferred from the indices, and an empty sparse tensor
    assert_same(torch.sparse_coo_tensor(i.to(DEV), v.to(DEV)), torch.sparse_coo_tensor(i, v))
    assert_same(torch.empty((3, 4), layout=torch.sparse_coo, device=DEV),
                torch.empty((3, 4), layout=torch.sparse_coo))
    assert_same(torch.zeros((2, 5), layout=torch.sparse_coo, device=DEV), torch.zeros((2, 5), layout=torch.sparse_coo))


def test_dense_to_sparse_and_back():
    x = _dense()
    s = x.to(DEV).to_sparse()
    assert_same(s, x.to_sparse())
    assert components_on_device(s)
    assert_same(s.to_dense(), x)
    # hybrid: one sparse dim, a dense dim
    assert_same(x.to(DEV).to_sparse(1), x.to_sparse(1))
    assert_same(x.to(DEV).to_sparse(1).to_dense(), x)


def test_to_and_from_cpu():
    cpu = _uncoalesced_coo()
    dev = cpu.to(DEV)
    assert_same(dev, cpu)
    back = dev.to("cpu")
    assert back.device.type == "cpu" and back.layout == torch.sparse_coo
    torch.testing.assert_close(back.to_dense(), cpu.to_dense(), rtol=0, atol=0)
    # across vnpu devices and dtypes
    if torch.vnpu.device_count() > 1:
        d1 = dev.to("vnpu:1")
        assert d1.device == torch.device("vnpu:1") and d1._values().device == torch.device("vnpu:1")
        torch.testing.assert_close(d1.cpu().to_dense(), cpu.to_dense(), rtol=0, atol=0)
    assert_same(dev.to(torch.float64), cpu.to(torch.float64))


def test_coalesce():
    cpu = _uncoalesced_coo()
    dev = cpu.to(DEV)
    assert not dev.is_coalesced()
    c = dev.coalesce()
    assert_same(c, cpu.coalesce())
    assert c.is_coalesced() and c.coalesce() is c  # coalesced tensors are returned as they are, as on CPU
    assert_same(c.indices(), cpu.coalesce().indices())
    assert_same(c.values(), cpu.coalesce().values())
    assert dev._nnz() == cpu._nnz() == 5 and c._nnz() == 3


def test_values_are_views_of_device_memory():
    dev = _dense().to(DEV).to_sparse()
    v = dev._values()
    assert v.data_ptr() == dev._values().data_ptr()
    v.mul_(2)  # writes through to the sparse tensor, as on CPU
    torch.testing.assert_close(dev.to_dense().cpu(), _dense() * 2, rtol=0, atol=0)


def test_arithmetic():
    a, b = _dense(1), _dense(2)
    sa, sb = a.to_sparse(), b.to_sparse()
    da, db = sa.to(DEV), sb.to(DEV)
    assert_same(da + db, sa + sb)
    assert_same(da - db, sa - sb)
    assert_same(da * db, sa * sb)
    assert_same(da * 2.5, sa * 2.5)
    assert_same(da / 2, sa / 2)
    assert_same(-da, -sa)
    assert_same(b.to(DEV) + da, b + sa)         # dense + sparse -> dense
    assert_same(torch.add(b.to(DEV), da, alpha=3), torch.add(b, sa, alpha=3))
    assert_same(da.t(), sa.t())
    assert_same(torch.sparse.sum(da), torch.sparse.sum(sa))
    assert_same(torch.sparse.sum(da, dim=1), torch.sparse.sum(sa, dim=1))
    assert_same(da.sum(), sa.sum())
    assert_same(da.abs(), sa.abs())
    assert_same(b.to(DEV).sparse_mask(da.coalesce()), b.sparse_mask(sa.coalesce()))
    assert_same(torch.cat([da, db]), torch.cat([sa, sb]))
    assert_same(da.index_select(1, torch.tensor([0, 2, 5], device=DEV)), sa.index_select(1, torch.tensor([0, 2, 5])))
    # sparse + dense is CPU's error too
    with pytest.raises(RuntimeError, match=r"add\(sparse, dense\) is not supported"):
        da + b.to(DEV)


def test_in_place_replaces_components():
    sa, sb = _dense(1).to_sparse(), _dense(2).to_sparse()
    da, db = sa.to(DEV), sb.to(DEV)
    ptr = da._values().data_ptr()
    da.add_(db)
    sa.add_(sb)
    assert_same(da, sa)
    assert components_on_device(da)
    assert da._values().data_ptr() != ptr  # the kernel built new components, now in device memory
    da.mul_(3)
    sa.mul_(3)
    assert_same(da, sa)
    da.zero_()
    sa.zero_()
    assert_same(da, sa)
    # copy_ from a CPU sparse tensor into a vnpu one (allowed across devices, as on CUDA)
    dst = torch.zeros((5, 6), layout=torch.sparse_coo, device=DEV)
    dst.copy_(sb)
    assert_same(dst, sb.clone())
    # sparse_resize_: metadata-only change
    r = _uncoalesced_coo().to(DEV)
    r.sparse_resize_((4, 6), 2, 0)
    r_cpu = _uncoalesced_coo()
    r_cpu.sparse_resize_((4, 6), 2, 0)
    assert_same(r, r_cpu)


def test_sparse_mm_and_addmm():
    a, m = _dense(3, (4, 5)), torch.randn(5, 3)
    sa = a.to_sparse()
    da, dm = sa.to(DEV), m.to(DEV)
    assert_same(torch.sparse.mm(da, dm), torch.sparse.mm(sa, m))
    assert_same(torch.mm(da, dm), torch.mm(sa, m))
    assert_same(da @ dm, sa @ m)
    assert_same(torch.sparse.mm(da, da.t()), torch.sparse.mm(sa, sa.t()))  # sparse x sparse -> sparse
    c = torch.randn(4, 3)
    assert_same(torch.addmm(c.to(DEV), da, dm, beta=0.5, alpha=2.0), torch.addmm(c, sa, m, beta=0.5, alpha=2.0))
    assert_same(torch.sparse.addmm(c.to(DEV), da, dm), torch.sparse.addmm(c, sa, m))
    out = torch.empty(1, device=DEV)
    torch.mm(da, dm, out=out)  # out= of another size: resized as on CPU
    assert_same(out, torch.mm(sa, m))


def test_coo_gradients():
    a, m = _dense(4, (4, 5)), torch.randn(5, 3)

    def run(dev):
        s = fresh(a.to_sparse(), dev).requires_grad_()
        w = fresh(m, dev).requires_grad_()
        out = torch.sparse.mm(s, w)
        (out * torch.arange(12.0, device=dev).view(4, 3)).sum().backward()
        return out, s.grad, w.grad

    cpu, dev = run("cpu"), run(DEV)
    for got, exp in zip(dev, cpu):
        assert_same(got, exp)

    def run_dense(dev):
        x = fresh(a, dev).requires_grad_()
        y = (x.to_sparse() * 2).to_dense()
        (y * y).sum().backward()
        return y, x.grad

    for got, exp in zip(run_dense(DEV), run_dense("cpu")):
        assert_same(got, exp)

    def run_values(dev):
        i = torch.tensor([[0, 1, 2], [1, 0, 2]], device=dev)
        v = torch.tensor([1.0, 2.0, 3.0], device=dev, requires_grad=True)
        s = torch.sparse_coo_tensor(i, v, (3, 3))
        torch.sparse.sum(s * s).backward()
        return v.grad

    assert_same(run_values(DEV), run_values("cpu"))


def test_print_matches_cpu():
    def same_text(dev_repr, cpu_repr):  # CPU's text plus the device; line breaks may move
        assert dev_repr.split() == cpu_repr.replace("size=", "device='vnpu:0', size=").split()

    cpu = _uncoalesced_coo()
    same_text(repr(cpu.to(DEV)), repr(cpu))
    same_text(repr(cpu.to(DEV).coalesce()), repr(cpu.coalesce()))
    csr = _dense().to_sparse_csr()
    same_text(repr(csr.to(DEV)), repr(csr))


def test_save_load(tmp_path):
    cpu = _uncoalesced_coo()
    csr = _dense().to_sparse_csr()
    torch.save({"coo": cpu.to(DEV), "csr": csr.to(DEV)}, tmp_path / "s.pt")
    on_cpu = torch.load(tmp_path / "s.pt", map_location="cpu")
    assert on_cpu["coo"].device.type == "cpu" and on_cpu["csr"].device.type == "cpu"
    torch.testing.assert_close(on_cpu["coo"].to_dense(), cpu.to_dense(), rtol=0, atol=0)
    torch.testing.assert_close(on_cpu["csr"].to_dense(), csr.to_dense(), rtol=0, atol=0)
    on_dev = torch.load(tmp_path / "s.pt")
    assert_same(on_dev["coo"], cpu)
    assert_same(on_dev["csr"], csr)
    # and a CPU checkpoint onto vnpu
    buf = io.BytesIO()
    torch.save(cpu, buf)
    buf.seek(0)
    assert_same(torch.load(buf, map_location=DEV), cpu)


# ----------------------------------------------------------------------------------------- compressed

@pytest.mark.parametrize("layout", [torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc])
def test_compressed_conversions(layout):
    x = _dense(5, (4, 6), density=0.5)
    block = (2, 3) if layout in (torch.sparse_bsr, torch.sparse_bsc) else None
    cpu = x.to_sparse(layout=layout, blocksize=block)
    dev = x.to(DEV).to_sparse(layout=layout, blocksize=block)
    assert_same(dev, cpu)
    assert components_on_device(dev)
    assert_same(dev.to_dense(), x)
    assert_same(cpu.to(DEV), cpu)
    # compressed -> COO and COO -> compressed on the device
    assert_same(dev.to_sparse(), cpu.to_sparse())
    assert_same(x.to_sparse().to(DEV).to_sparse(layout=layout, blocksize=block),
                x.to_sparse().to_sparse(layout=layout, blocksize=block))
    named = {torch.sparse_csr: "to_sparse_csr", torch.sparse_csc: "to_sparse_csc"}
    if layout in named:
        assert_same(getattr(x.to(DEV), named[layout])(), getattr(x, named[layout])())


def test_csr_ops():
    x, m = _dense(6, (4, 5)), torch.randn(5, 3)
    cpu = x.to_sparse_csr()
    dev = cpu.to(DEV)
    assert_same(dev @ m.to(DEV), cpu @ m)
    assert_same(torch.addmm(torch.ones(4, 3, device=DEV), dev, m.to(DEV)), torch.addmm(torch.ones(4, 3), cpu, m))
    assert_same(dev * 2, cpu * 2)
    assert_same(dev.transpose(0, 1), cpu.transpose(0, 1))
    assert_same(dev.clone(), cpu.clone())
    assert_same(dev.sin(), cpu.sin())
    d = dev.clone()
    d.mul_(3)
    c = cpu.clone()
    c.mul_(3)
    assert_same(d, c)
    assert dev._nnz() == cpu._nnz() and dev.values().device == dev.device
    # built from device components
    built = torch.sparse_csr_tensor(cpu.crow_indices().to(DEV), cpu.col_indices().to(DEV), cpu.values().to(DEV),
                                    cpu.shape)
    assert_same(built, cpu)


@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin"])
def test_sparse_mm_reduce_and_grad(reduce):
    x, m = _dense(7, (5, 4), density=0.6), torch.randn(4, 3)

    def run(dev):
        a = fresh(x.to_sparse_csr(), dev).requires_grad_()
        w = fresh(m, dev).requires_grad_()
        out = torch.sparse.mm(a, w, reduce)
        (out * torch.arange(15.0, device=dev).view(5, 3)).sum().backward()
        return out, a.grad, w.grad

    for got, exp in zip(run(DEV), run("cpu")):
        assert_same(got, exp)


def test_sparse_sampled_addmm_and_grad():
    mask = _dense(8, (4, 5), density=0.5)
    c = (mask + 0.5 * (mask != 0)).to_sparse_csr()
    a, b = torch.randn(4, 3), torch.randn(3, 5)

    def run(dev):
        cc = fresh(c, dev).requires_grad_()
        aa, bb = fresh(a, dev).requires_grad_(), fresh(b, dev).requires_grad_()
        out = torch.sparse.sampled_addmm(cc, aa, bb, beta=0.5, alpha=2.0)
        out.to_dense().sum().backward()
        return out, cc.grad, aa.grad, bb.grad

    for got, exp in zip(run(DEV), run("cpu")):
        assert_same(got, exp)
    out = torch.sparse.sampled_addmm(c.to(DEV), a.to(DEV), b.to(DEV))
    dst = c.to(DEV).clone()
    torch.sparse.sampled_addmm(c.to(DEV), a.to(DEV), b.to(DEV), out=dst)
    assert_same(dst, out.cpu())


# ---------------------------------------------------------------------------------------------- errors

def test_device_errors_like_cuda():
    s_cpu = _dense().to_sparse()
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.sparse.mm(s_cpu, torch.randn(6, 2, device=DEV))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.sparse.mm(s_cpu.to(DEV), torch.randn(6, 2))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        s_cpu.to(DEV) + s_cpu
    if torch.vnpu.device_count() > 1:
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            s_cpu.to(DEV) + s_cpu.to("vnpu:1")


def test_unsupported_raise_not_implemented():
    s = _dense().to_sparse()
    # ops without a sparse CPU kernel raise CPU's NotImplementedError on vnpu too
    with pytest.raises(NotImplementedError) as cpu_err:
        torch.ops.aten.cumsum(s, 0)
    with pytest.raises(NotImplementedError) as dev_err:
        torch.ops.aten.cumsum(s.to(DEV), 0)
    assert "SparseCPU" in str(cpu_err.value) and "SparseCPU" in str(dev_err.value)
    # other layouts are not supported
    with pytest.raises(RuntimeError):
        torch.empty(2, 2, layout=torch._mkldnn, device=DEV)


def test_invalid_inputs_raise_cpu_errors():
    i = torch.tensor([[0, 5]])  # index out of bounds for size 3
    v = torch.tensor([1.0, 2.0])
    with pytest.raises(RuntimeError) as cpu_err:
        torch.sparse_coo_tensor(i, v, (3,), check_invariants=True)
    with pytest.raises(RuntimeError) as dev_err:
        torch.sparse_coo_tensor(i, v, (3,), device=DEV, check_invariants=True)
    assert str(dev_err.value).split("\n")[0] == str(cpu_err.value).split("\n")[0]
    # the device stays usable
    assert_same(torch.ones(2, device=DEV), torch.ones(2))


def test_executed_ops_lists_sparse_kernels():
    torch.vnpu.reset_op_stats()
    _ = (_dense().to(DEV).to_sparse() * 2).to_dense()
    ops = torch.vnpu.get_executed_ops()
    assert ops.get("aten::_to_sparse", 0) >= 1 and ops.get("aten::mul.Tensor", 0) >= 1, ops
    # sparse kernels synchronize by design (as CUDA's do); they are not a fallback
    assert not any("sparse" in k for k in torch.vnpu.get_fallback_ops())


def test_repeated_construction_from_device_components():
    # torch.sparse_coo_tensor syncs the stream while holding the GIL (size inference reads the indices); stream
    # tasks must never need the GIL then (Note [No Python tensors in stream tasks], csrc/ops/CpuAlias.cpp).
    i = torch.tensor([[0, 1, 1], [2, 0, 2]])
    v = torch.tensor([3.0, 4.0, 5.0])
    expected = torch.sparse_coo_tensor(i, v)
    for _ in range(200):
        s = torch.sparse_coo_tensor(i.to(DEV), v.to(DEV))
    assert_same(s, expected)


def test_factory_results_requested_on_cpu():
    x = _dense().to_sparse_csr()
    for fn in (torch.zeros_like, torch.randn_like):
        r = fn(x.to(DEV), device="cpu")
        assert r.device.type == "cpu" and r.layout == torch.sparse_csr
        assert all(c.device.type == "cpu" for c in (r.crow_indices(), r.col_indices(), r.values()))
        exp = fn(x, device="cpu")  # the oracle (randn_like: same structure, other draws)
        torch.testing.assert_close(r.crow_indices(), exp.crow_indices(), rtol=0, atol=0)
        torch.testing.assert_close(r.col_indices(), exp.col_indices(), rtol=0, atol=0)
    assert_same(torch.zeros_like(x.to(DEV)), torch.zeros_like(x))


def test_opinfo_sparse_samples_float32():
    # every OpInfo's sparse sample inputs (COO, CSR, CSC, BSR, BSC) in float32 vs CPU: scripts/sparse_parity.py
    import os
    import subprocess
    import sys
    script = os.path.join(os.path.dirname(__file__), "..", "scripts", "sparse_parity.py")
    r = subprocess.run([sys.executable, script, "--dtypes", "float32"], capture_output=True, text=True, timeout=600,
                       cwd=os.path.dirname(__file__))
    assert r.returncode == 0 and " 0 failed" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
