"""Port mode loads checkpoints saved on a GPU machine (storages tagged "cuda:i") as torch.load would onto CUDA:
"cuda:i" -> vnpu:i, for every map_location form, weights_only, mmap and the legacy format. Oracle: the same
checkpoint loaded with map_location="cpu" (values), and CUDA's placement rules (devices).

The checkpoint is written here without a GPU: tensors on vnpu:0 / vnpu:1 saved while a test-only tagger
(torch.serialization.register_package, removed afterwards) tags their storages "cuda:0" / "cuda:1", which is
what torch.save writes on a 2-GPU machine."""
import json
import os
import subprocess
import sys
import textwrap
import zipfile

import pytest
import torch
import torch.serialization as serialization


def _cuda_tag(storage):
    if storage.device.type == "vnpu":
        return f"cuda:{storage.device.index}"
    return None


@pytest.fixture(scope="module")
def gpu_checkpoint(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu_ckpt")
    torch.manual_seed(0)
    a = torch.randn(3, 4).to("vnpu:0")
    state = {
        "a": a,
        "view": a[1],  # a view: shares a's storage after loading too
        "b": torch.arange(6, dtype=torch.int64).to("vnpu:1"),
        "nested": [torch.randn(5).to(torch.bfloat16).to("vnpu:1")],
        "step": 7,
    }
    linear = torch.nn.Linear(4, 3)
    entry = (1, _cuda_tag, lambda storage, location: None)  # priority 1: before the CPU and vnpu taggers
    serialization.register_package(*entry)
    try:
        torch.save(state, d / "ckpt.pt")
        torch.save(state, d / "legacy.pt", _use_new_zipfile_serialization=False)
        torch.save(linear.to("vnpu:1").state_dict(), d / "linear.pt")
    finally:
        serialization._package_registry.remove(entry)
    with zipfile.ZipFile(d / "ckpt.pt") as z:
        pickle_bytes = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    assert b"cuda:0" in pickle_bytes and b"cuda:1" in pickle_bytes and b"vnpu" not in pickle_bytes
    return d


def _describe(obj):
    """{key: [device, dtype, values]} of the tensors in a loaded checkpoint (values as the CPU sees them)."""
    out = {}
    for key, t in (("a", obj["a"]), ("view", obj["view"]), ("b", obj["b"]), ("nested", obj["nested"][0])):
        out[key] = [str(t.device), str(t.dtype), t.cpu().float().tolist()]
    return out


def test_outside_port_mode_torch_refuses_as_without_cuda(gpu_checkpoint):
    # The checkpoint really carries CUDA tags: torch's CUDA deserializer checks the (absent) CUDA device.
    before = list(serialization._package_registry)
    with pytest.raises(RuntimeError, match=r"deserialize object on a CUDA device but torch.cuda.is_available\(\)"):
        torch.load(gpu_checkpoint / "ckpt.pt")
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(gpu_checkpoint / "ckpt.pt", map_location={"cuda:0": "cuda:1"})
    assert serialization._package_registry == before  # importing torch_vnpu registered nothing for "cuda"


CHILD = r"""
import json, sys, torch
import torch_vnpu.port.cuda as port
import torch.serialization as serialization

ckpt, legacy, linear_path = sys.argv[1:4]

def describe(obj):
    out = {}
    for key, t in (("a", obj["a"]), ("view", obj["view"]), ("b", obj["b"]), ("nested", obj["nested"][0])):
        out[key] = [str(t.device), str(t.dtype), t.cpu().float().tolist()]
    out["view_shares_a"] = obj["view"].untyped_storage().data_ptr() == obj["a"].untyped_storage().data_ptr()
    out["step"] = obj["step"]
    return out

cases = {
    "none": lambda: torch.load(ckpt),
    "weights_only_false": lambda: torch.load(ckpt, weights_only=False),
    "mmap": lambda: torch.load(ckpt, mmap=True),
    "legacy": lambda: torch.load(legacy),
    "legacy_weights_only_false": lambda: torch.load(legacy, weights_only=False),
    "legacy_dict": lambda: torch.load(legacy, map_location={"cuda:1": "cuda:0"}),
    "dict_0_to_1": lambda: torch.load(ckpt, map_location={"cuda:0": "cuda:1"}),
    "dict_1_to_cpu": lambda: torch.load(ckpt, map_location={"cuda:1": "cpu"}),
    "lambda_cuda": lambda: torch.load(ckpt, map_location=lambda s, loc: s.cuda()),
    "lambda_cuda_1": lambda: torch.load(ckpt, map_location=lambda s, loc: s.cuda(1)),
    "lambda_none": lambda: torch.load(ckpt, map_location=lambda s, loc: None),
    "lambda_cpu": lambda: torch.load(ckpt, map_location=lambda s, loc: s),
    "str_cuda": lambda: torch.load(ckpt, map_location="cuda"),
    "str_cuda_1": lambda: torch.load(ckpt, map_location="cuda:1"),
    "device_cuda": lambda: torch.load(ckpt, map_location=torch.device("cuda")),
    "device_cuda_1": lambda: torch.load(ckpt, map_location=torch.device("cuda", 1)),
    "mmap_dict": lambda: torch.load(ckpt, mmap=True, map_location={"cuda:0": "cuda:1"}),
}
results = {}
for name, load in cases.items():
    results[name] = describe(load())
try:
    torch.load(ckpt, map_location={"cuda:0": "cuda:7"})
except Exception as e:
    results["bad_index"] = [type(e).__name__, str(e)]
model = torch.nn.Linear(4, 3).cuda()
model.load_state_dict(torch.load(linear_path))
results["model"] = {k: [str(v.device), v.cpu().tolist()] for k, v in model.state_dict().items()}
port.disable()
try:
    torch.load(ckpt)
except RuntimeError as e:
    results["after_disable"] = str(e)
print(json.dumps(results))
"""


def test_gpu_checkpoint_loads_onto_vnpu_like_cuda(gpu_checkpoint, tmp_path):
    d = gpu_checkpoint
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), str(d / "ckpt.pt"), str(d / "legacy.pt"), str(d / "linear.pt")],
        capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
        env=dict(os.environ, VNPU_DEVICE_COUNT="2", PYTHONWARNINGS="ignore"),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])

    oracle = _describe(torch.load(d / "ckpt.pt", map_location="cpu"))  # values; CPU placement
    saved_on = {"a": 0, "view": 0, "b": 1, "nested": 1}  # the "cuda:i" tag of each tensor

    def expect(name, place):
        """place(i) -> the device CUDA would put a storage tagged cuda:i on (as vnpu / cpu)."""
        got = results[name]
        for key, (device, dtype, values) in oracle.items():
            assert got[key] == [place(saved_on[key]), dtype, values], (name, key, got[key])
        assert got["step"] == 7 and got["view_shares_a"], name

    for name in ("none", "weights_only_false", "mmap", "legacy", "legacy_weights_only_false", "lambda_none"):
        expect(name, lambda i: f"vnpu:{i}")  # each storage back on the device it was saved from
    expect("legacy_dict", lambda i: "vnpu:0")
    expect("dict_0_to_1", lambda i: "vnpu:1")
    expect("mmap_dict", lambda i: "vnpu:1")
    expect("dict_1_to_cpu", lambda i: "vnpu:0" if i == 0 else "cpu")
    expect("lambda_cuda", lambda i: "vnpu:0")  # storage.cuda(): the current device
    expect("lambda_cuda_1", lambda i: "vnpu:1")
    expect("lambda_cpu", lambda i: "cpu")
    expect("str_cuda", lambda i: "vnpu:0")
    expect("device_cuda", lambda i: "vnpu:0")
    expect("str_cuda_1", lambda i: "vnpu:1")
    expect("device_cuda_1", lambda i: "vnpu:1")

    # A device index the machine does not have: RuntimeError, as torch.load onto a 2-GPU machine.
    kind, message = results["bad_index"]
    assert kind == "RuntimeError" and "device 7" in message and "device_count() is 2" in message, message

    # The common pattern: model.cuda(); model.load_state_dict(torch.load(path)).
    cpu_state = torch.load(d / "linear.pt", map_location="cpu")
    assert results["model"] == {k: ["vnpu:0", v.tolist()] for k, v in cpu_state.items()}

    # disable(): torch's own behaviour again (the CUDA deserializer refuses).
    assert "deserialize object on a CUDA device but torch.cuda.is_available() is False" in results["after_disable"]


OWN_CHECKPOINT_CHILD = r"""
import json, torch
import torch_vnpu.port.cuda  # noqa: F401  (port mode, as a CUDA script starts)
torch.manual_seed(0)
a = torch.randn(3, 4, device="cuda:0")
b = torch.arange(6, device="cuda:1")
torch.save({"a": a, "b": b}, "own.pt")  # saved in port mode: storages tagged vnpu:0 / vnpu:1
out = {}
for name, loc in {"0_to_1": {"cuda:0": "cuda:1"}, "1_to_cpu": {"cuda:1": "cpu"},
                  "swap": {"cuda:0": "cuda:1", "cuda:1": "cuda:0"}, "none": None}.items():
    s = torch.load("own.pt", map_location=loc)
    out[name] = [str(s["a"].device), str(s["b"].device), s["a"].cpu().tolist() == a.cpu().tolist(),
                 s["b"].cpu().tolist() == b.cpu().tolist()]
print(json.dumps(out))
"""


def test_a_checkpoint_saved_in_port_mode_follows_a_cuda_map_location_dict(tmp_path):
    """The script saves on "cuda:i" (vnpu:i underneath) and reloads with map_location={"cuda:0": "cuda:1"}: the
    dict applies as on CUDA (a storage from cuda:0 lands on cuda:1), not silently ignored."""
    proc = subprocess.run([sys.executable, "-c", OWN_CHECKPOINT_CHILD], capture_output=True, text=True, timeout=300,
                          cwd=str(tmp_path), env=dict(os.environ, VNPU_DEVICE_COUNT="2", PYTHONWARNINGS="ignore"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"0_to_1": ["vnpu:1", "vnpu:1", True, True], "1_to_cpu": ["vnpu:0", "cpu", True, True],
                   "swap": ["vnpu:1", "vnpu:0", True, True], "none": ["vnpu:0", "vnpu:1", True, True]}, got
