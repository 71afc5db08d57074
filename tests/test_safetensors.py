"""safetensors with vnpu: saving vnpu tensors, loading onto vnpu through the HF adapter (patch 7 in
docs/huggingface.md; applied when safetensors is imported), and the upstream behaviour without it."""
import pytest
import torch
from safetensors import SafetensorError
import safetensors
import safetensors.torch as st


@pytest.fixture
def checkpoint(tmp_path):
    g = torch.Generator().manual_seed(0)
    ref = {"w": torch.randn(4, 3, generator=g), "b": torch.arange(5, dtype=torch.int64),
           "h": torch.randn(2, 2, generator=g).to(torch.bfloat16)}
    path = tmp_path / "model.safetensors"
    st.save_file({k: v.to("vnpu") for k, v in ref.items()}, path)  # saved from vnpu tensors
    return path, ref


def test_save_from_vnpu_loads_on_cpu(checkpoint):
    path, ref = checkpoint
    out = st.load_file(path, device="cpu")
    for k, v in ref.items():
        assert out[k].dtype == v.dtype and torch.equal(out[k], v)


def test_without_adapter_device_string_is_rejected_upstream(checkpoint, monkeypatch):
    path, _ = checkpoint
    assert st.safe_open is not safetensors._safetensors_rust.safe_open  # `import safetensors` patched it
    monkeypatch.setattr(st, "safe_open", safetensors._safetensors_rust.safe_open)  # upstream's own
    monkeypatch.setattr(st, "load_file", getattr(st.load_file, "__wrapped__", st.load_file))
    with pytest.raises(SafetensorError, match="invalid"):
        st.load_file(path, device="vnpu")


@pytest.mark.parametrize("device", ["vnpu", "vnpu:1", torch.device("vnpu", 1)])
def test_adapter_loads_onto_vnpu(adapter, checkpoint, device):
    path, ref = checkpoint
    want = torch.device(device)
    want_index = want.index if want.index is not None else torch.vnpu.current_device()
    out = st.load_file(path, device=device)
    for k, v in ref.items():
        assert out[k].device == torch.device("vnpu", want_index)
        assert out[k].dtype == v.dtype and torch.equal(out[k].cpu(), v)
    with safetensors.safe_open(path, framework="pt", device=device) as f:
        assert torch.equal(f.get_tensor("w").cpu(), ref["w"]) and f.get_tensor("w").device.index == want_index


def test_adapter_leaves_other_devices_alone(adapter, checkpoint):
    path, ref = checkpoint
    assert st.load_file(path, device="cpu")["w"].device.type == "cpu"
    with pytest.raises(SafetensorError):
        st.load_file(path, device="nosuchdevice")


def test_adapter_patches_modules_that_imported_safe_open_before(adapter, checkpoint, tmp_path):
    # accelerate.utils.modeling did `from safetensors import safe_open` before enable(); its device_map
    # loading must accept vnpu devices too.
    from accelerate.utils.modeling import load_state_dict
    path, ref = checkpoint
    out = load_state_dict(str(path), device_map={"w": "vnpu:1", "b": "cpu", "h": "vnpu"})
    assert out["w"].device == torch.device("vnpu", 1) and torch.equal(out["w"].cpu(), ref["w"])
    assert out["b"].device.type == "cpu" and torch.equal(out["b"], ref["b"])
    assert out["h"].device.type == "vnpu" and torch.equal(out["h"].cpu(), ref["h"])


def test_safetensors_torch_imported_before_torch_is_adapted(checkpoint, tmp_path):
    path, ref = checkpoint
    """`from safetensors.torch import load_file` at the top of a script imports torch (and torch_vnpu) while
    safetensors.torch is still executing: the adapter must patch it once it finished (it warned and left
    safetensors unpatched before), so load_file(..., device="vnpu") works."""
    import subprocess
    import sys

    code = ("from safetensors.torch import load_file\nimport sys, torch\n"
            f"t = load_file(sys.argv[1], device='vnpu')\n"
            "print(sorted({str(v.device) for v in t.values()}))\n")
    proc = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", code, str(path)],
                          capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "['vnpu:0']", proc.stdout


def test_safetensors_own_keywords_still_work(adapter, tmp_path):
    """The patched load_file keeps safetensors' signature (load_model passes backend=...)."""
    m = torch.nn.Linear(4, 3)
    st.save_model(m, str(tmp_path / "m.safetensors"))
    fresh = torch.nn.Linear(4, 3)
    assert st.load_model(fresh, str(tmp_path / "m.safetensors")) == (set(), [])
    assert torch.equal(fresh.weight, m.weight)
    on_cpu = st.load_file(str(tmp_path / "m.safetensors"), device="cpu", backend="mmap")
    assert torch.equal(on_cpu["weight"], m.weight.detach())
