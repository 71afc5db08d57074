"""torch_vnpu.checkpoints.safetensors: safetensors files streamed onto vnpu through pinned staging buffers. Oracle: the same
file loaded by safetensors onto the CPU (bitwise), safetensors' own errors for malformed files."""

import gc
import os
import subprocess
import sys
import textwrap

import pytest
import safetensors
import safetensors.torch as st
import torch

from torch_vnpu.checkpoints import safetensors as vio

# Every dtype safetensors maps to torch, with a few shapes each (scalars, empty, odd sizes).
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2, torch.complex64,
          torch.uint16, torch.uint32, torch.uint64]


def _state():
    g = torch.Generator().manual_seed(0)
    out = {}
    for i, dtype in enumerate(DTYPES):
        for j, shape in enumerate(((), (0, 3), (7,), (33, 5), (2, 3, 129))):
            x = torch.randn(shape, generator=g, dtype=torch.float64) * 50
            if dtype == torch.bool:
                t = x > 0
            elif dtype.is_complex:
                t = torch.complex(x, -x).to(dtype)
            elif dtype in (torch.uint16, torch.uint32, torch.uint64):
                t = x.abs().to(torch.int64).to(dtype)
            else:
                t = x.to(dtype)
            out[f"t{i}_{j}"] = t
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.cpu().contiguous()
    return t.reshape(-1).view(torch.uint8) if t.numel() else t


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "model.safetensors"
    st.save_file(_state(), str(path), metadata={"format": "pt"})
    return str(path)


@pytest.mark.parametrize("chunk_bytes,slots", [(64, 1), (4096, 2), (16 << 20, 4)])
def test_every_dtype_is_bitwise_the_cpu_load(checkpoint, chunk_bytes, slots):
    """Small buffers split tensors across chunks and share one buffer between several small tensors."""
    ref = st.load_file(checkpoint, device="cpu")
    out = vio.load_file(checkpoint, "vnpu", chunk_bytes=chunk_bytes, slots=slots)
    assert out.keys() == ref.keys()
    for k, v in ref.items():
        assert out[k].device == torch.device("vnpu", 0) and out[k].dtype == v.dtype and out[k].shape == v.shape, k
        assert torch.equal(_bits(out[k]), _bits(v)), k


def test_second_device_and_conversion_on_load(checkpoint):
    ref = st.load_file(checkpoint, device="cpu")
    out = vio.load_file(checkpoint, torch.device("vnpu", 1), dtype=torch.bfloat16)
    for k, v in ref.items():
        assert out[k].device == torch.device("vnpu", 1), k
        want = v.to(torch.bfloat16) if v.is_floating_point() else v  # integers, bool, complex keep theirs
        assert out[k].dtype == want.dtype and torch.equal(_bits(out[k]), _bits(want)), k


def test_safetensors_load_file_onto_vnpu_uses_the_streamed_loader(checkpoint, monkeypatch):
    calls = []
    real = vio.load_file
    monkeypatch.setattr(vio, "load_file", lambda *a, **k: calls.append(a) or real(*a, **k))
    ref = st.load_file(checkpoint, device="cpu")
    out = st.load_file(checkpoint, device="vnpu:1")
    assert calls and all(torch.equal(_bits(out[k]), _bits(v)) and out[k].device.index == 1 for k, v in ref.items())


def test_work_queued_after_the_load_reads_the_loaded_bytes(checkpoint):
    """The call returns once the last upload is queued; kernels queued next on the stream see every byte."""
    ref = st.load_file(checkpoint, device="cpu")
    torch.vnpu._sleep(200_000_000)  # the stream is busy: every upload is still queued when load_file returns
    out = vio.load_file(checkpoint, "vnpu", chunk_bytes=1 << 12, slots=8)
    sums = {k: out[k].double().sum() for k, v in ref.items() if v.is_floating_point() and not v.is_complex()}
    for k, s in sums.items():
        assert s.item() == ref[k].double().sum().item(), k


def test_a_malformed_file_raises_safetensors_error_and_allocates_nothing(checkpoint, tmp_path):
    data = open(checkpoint, "rb").read()
    bad_header = tmp_path / "bad_header.safetensors"
    bad_header.write_bytes(data[:9] + b"#" + data[10:])  # the JSON header broken
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(data[: len(data) - 100])
    before = torch.vnpu.memory_allocated()
    for path in (bad_header, truncated):
        with pytest.raises(safetensors.SafetensorError) as cpu_error:
            st.load_file(str(path), device="cpu")
        with pytest.raises(safetensors.SafetensorError) as ours:
            vio.load_file(str(path), "vnpu")
        assert str(ours.value) == str(cpu_error.value)
    assert torch.vnpu.memory_allocated() == before


def test_a_file_shorter_than_its_header_says_names_the_tensor_and_frees_everything(checkpoint, monkeypatch):
    """The file changed after its header was validated: the short read raises RuntimeError naming the file and
    the tensor, and the tensors allocated for the load go back to the allocator."""
    from torch_vnpu.checkpoints._files import OpenedFile

    with OpenedFile(checkpoint) as file:
        start, header = vio._header(file)
    size = os.path.getsize(checkpoint)
    last = max(header, key=lambda k: header[k]["data_offsets"][1])
    monkeypatch.setattr(vio, "_header", lambda file: (start + 64, header))  # as if 64 bytes had gone
    torch.vnpu.synchronize()
    before = torch.vnpu.memory_allocated()
    with pytest.raises(RuntimeError, match=f"{checkpoint} ended at byte {size} while reading tensor '{last}'"):
        vio.load_file(checkpoint, "vnpu", chunk_bytes=1 << 12)
    assert torch.vnpu.memory_allocated() == before
    assert torch.equal(torch.ones(3, device="vnpu").cpu(), torch.ones(3))  # the device and stream work on


def test_another_device_type_or_a_bad_ring_is_refused(checkpoint):
    with pytest.raises(ValueError, match="vnpu devices"):
        vio.load_file(checkpoint, "cpu")
    for kwargs in ({"chunk_bytes": -1}, {"chunk_bytes": 0}, {"slots": 0}):
        with pytest.raises(ValueError, match="chunk_bytes and slots must be positive"):
            vio.load_file(checkpoint, "vnpu", **kwargs)


@pytest.mark.parametrize("code", ["F8_E8M0", "F4"])
def test_dtypes_only_safetensors_reader_builds_load_as_on_cpu(tmp_path, code):
    """float8_e8m0 and packed float4 have no entry in safetensors.torch's dtype table; they load as on CPU."""
    import json
    import struct

    n = 4 if code == "F8_E8M0" else 2  # four values: one byte each, or two per byte (packed float4)
    header = json.dumps({"x": {"dtype": code, "shape": [4], "data_offsets": [0, n]},
                         "y": {"dtype": "F32", "shape": [2], "data_offsets": [n, n + 8]}}).encode()
    header += b" " * (-len(header) % 8)
    path = tmp_path / "odd.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes([1, 127, 128, 200][:n])
                     + struct.pack("<2f", 1.5, -2.0))
    ref = st.load_file(str(path), device="cpu")
    out = st.load_file(str(path), device="vnpu")
    for k, v in ref.items():
        assert out[k].device.type == "vnpu" and out[k].dtype == v.dtype and out[k].shape == v.shape, k
        assert torch.equal(_bits(out[k]), _bits(v)), k


# (how the 96 MiB checkpoint is written, how it is loaded)
_OOM_CASES = {
    "safetensors": ('import safetensors.torch as st\nst.save_file(state, "{d}/big")',
                    'from torch_vnpu.checkpoints import safetensors as vio\nvio.load_file("{d}/big", "vnpu")'),
    "torch.load": ('torch.save(state, "{d}/big")', 'torch.load("{d}/big", map_location="vnpu")'),
}


@pytest.mark.parametrize("form", sorted(_OOM_CASES))
def test_a_checkpoint_larger_than_the_device_raises_oom_and_frees_what_it_loaded(tmp_path, form):
    save, load = (c.format(d=tmp_path) for c in _OOM_CASES[form])
    code = "\n".join([
        "import torch",
        'state = {f"w{i}": torch.ones(1 << 20) for i in range(24)}  # 96 MiB',
        save,
        "before = torch.vnpu.memory_allocated()",
        "try:",
        textwrap.indent(load, "    "),
        '    print("loaded")',
        "except torch.OutOfMemoryError:",
        '    print("oom", torch.vnpu.memory_allocated() == before)',
        'print(torch.ones(4, device="vnpu").sum().item())',
    ])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, VNPU_MEMORY_PER_DEVICE="64M"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["oom", "True", "4.0"], proc.stdout


def _child(code, tmp_path, **env):
    """The standard output of ``code`` run in a fresh interpreter (in tmp_path, with ``env`` added); it must
    succeed."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, **env), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def test_the_sanitizer_sees_no_race_in_a_load_then_use(checkpoint, tmp_path):
    code = (f"import torch\nfrom torch_vnpu.checkpoints import safetensors as vio\n"
            f"out = vio.load_file({checkpoint!r}, 'vnpu', chunk_bytes=4096)\n"
            "s = sum(v.double().sum() for v in out.values() if v.is_floating_point() and not v.is_complex())\n"
            "print(torch.isfinite(s).item())\n")
    assert _child(code, tmp_path, VNPU_SANITIZE="1") == "True"


def test_a_load_takes_no_host_memory_beyond_a_tenth_of_the_checkpoint(tmp_path):
    """The device reads the file into its memory: the process's private (anonymous) memory does not grow with the
    checkpoint (device memory is shared memory, counted apart). A CPU load grows it by the whole checkpoint."""
    code = ("import torch, safetensors.torch as st\nfrom torch_vnpu.checkpoints import safetensors as vio\n"
            "def anon():\n"
            "    return next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('RssAnon'))\n"
            "st.save_file({f'w{i}': torch.randn(512, 1024) for i in range(32)}, 'c.safetensors')  # 64 MiB\n"
            "torch.zeros(1, device='vnpu'); torch.vnpu.synchronize()\n"
            "before = anon()\n"
            "out = vio.load_file('c.safetensors', 'vnpu')\n"
            "torch.vnpu.synchronize()\n"
            "print((anon() - before) / 2**20, sum(v.numel() for v in out.values()) * 4 / 2**20)\n")
    grown, checkpoint = map(float, _child(code, tmp_path).split())
    assert checkpoint == 64 and grown <= 0.1 * checkpoint, grown


def test_the_staged_path_of_a_device_without_file_reads_loads_the_same_bits(checkpoint, tmp_path):
    """VNPU_FILE_READS=0: pinned staging buffers and uploads (what a runtime without file reads does), with small
    buffers that split tensors and share a buffer between small ones."""
    code = (f"import torch, safetensors.torch as st\nfrom torch_vnpu.checkpoints import safetensors as vio\n"
            f"ref = st.load_file({checkpoint!r}, device='cpu')\n"
            f"out = vio.load_file({checkpoint!r}, 'vnpu', chunk_bytes=4096, slots=2)\n"
            "bits = lambda t: t.cpu().contiguous().reshape(-1).view(torch.uint8) if t.numel() else t.cpu()\n"
            "print(all(torch.equal(bits(out[k]), bits(v)) for k, v in ref.items()))\n")
    assert _child(code, tmp_path, VNPU_FILE_READS="0") == "True"


# ---------------------------------------------------------------- saving

def _safetensors_own_save(tensors, path, metadata=None):
    """safetensors' save_file itself (the adapter's wrapper keeps it as __wrapped__), from CPU copies."""
    save = getattr(st.save_file, "__wrapped__", st.save_file)
    save({k: v.cpu() for k, v in tensors.items()}, str(path), metadata=metadata)


@pytest.mark.parametrize("chunk_bytes,slots", [(7, 1), (4096, 3), (16 << 20, 4)])
def test_save_file_writes_the_bytes_safetensors_writes(tmp_path, chunk_bytes, slots):
    """Every dtype, scalars, empty tensors, a non-ASCII name, metadata, tensors on two devices and the CPU: the
    file equals safetensors' own, byte for byte (header, order, padding, data)."""
    state = {k: v.to("vnpu:1" if i % 3 == 0 else "vnpu") if i % 5 else v for i, (k, v) in enumerate(_state().items())}
    state["é.名"] = torch.arange(5.0, device="vnpu")
    _safetensors_own_save(state, tmp_path / "ref.safetensors", {"format": "pt"})
    vio.save_file(state, tmp_path / "out.safetensors", {"format": "pt"}, chunk_bytes=chunk_bytes, slots=slots)
    assert (tmp_path / "out.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["out.safetensors", "ref.safetensors"]  # no temporary file left


def test_conjugate_and_negative_views_are_saved_with_their_values(tmp_path):
    """A conjugate or negative view's memory holds the values without the bit: the file gets the values (what
    .cpu() gives), on vnpu and for a CPU view saved beside vnpu tensors (safetensors' own CPU save writes the raw
    memory there, which is wrong)."""
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    f = torch.tensor([1.0, -3.0])
    state = {"z": z.to("vnpu").conj(), "f": torch._neg_view(f.to("vnpu")), "zc": z.conj(), "fc": torch._neg_view(f),
             "plain": torch.arange(3.0, device="vnpu")}
    assert all(v.is_contiguous() for v in state.values())
    vio.save_file(state, tmp_path / "out.safetensors")
    back = st.load_file(str(tmp_path / "out.safetensors"))
    for k, v in state.items():
        assert torch.equal(back[k], v.resolve_conj().resolve_neg().cpu()), k
    _safetensors_own_save({k: v.resolve_conj().resolve_neg() for k, v in state.items()}, tmp_path / "ref.safetensors")
    assert (tmp_path / "out.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()
    assert state["z"].is_conj() and state["f"].is_neg()  # the caller's tensors are left as they were


def test_saves_to_one_path_from_two_threads_each_write_a_whole_file(tmp_path):
    """Each save writes its own temporary file and renames it: the file at the path is one of the two checkpoints
    whole (the last rename), never a mix, and no temporary file is left."""
    import threading

    path = tmp_path / "latest.safetensors"
    a = {"w": torch.full((1 << 21,), 1.0, device="vnpu:0")}
    b = {"w": torch.full((1 << 19,), 2.0, device="vnpu:1"), "b": torch.ones(3, device="vnpu:1")}
    for trial in range(4):
        errors = []

        def run(d):
            try:
                vio.save_file(d, path, chunk_bytes=1 << 16)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(d,)) for d in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        back = st.load_file(str(path))
        assert any(back.keys() == d.keys() and all(torch.equal(back[k], v.cpu()) for k, v in d.items())
                   for d in (a, b)), trial
        assert os.listdir(tmp_path) == ["latest.safetensors"]


def test_the_file_is_made_as_safetensors_makes_it(tmp_path):
    """A name of 250 characters saves (the temporary name keeps within NAME_MAX), and the file's mode is the one
    safetensors' own save gives (0600), also over an existing file."""
    name = "m" * 238 + ".safetensors"
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / name).write_bytes(b"earlier")
    (tmp_path / name).write_bytes(b"earlier")
    os.chmod(tmp_path / name, 0o644)
    vio.save_file({"w": torch.ones(4, device="vnpu")}, tmp_path / name)
    _safetensors_own_save({"w": torch.ones(4)}, tmp_path / "own" / name)
    assert (tmp_path / name).read_bytes() == (tmp_path / "own" / name).read_bytes()
    assert os.stat(tmp_path / name).st_mode & 0o777 == os.stat(tmp_path / "own" / name).st_mode & 0o777 == 0o600


def test_safetensors_save_file_and_save_model_of_vnpu_tensors_use_the_streamed_writer(tmp_path, monkeypatch):
    calls = []
    real = vio.save_file
    monkeypatch.setattr(vio, "save_file", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight  # tied: save_model drops the duplicate
    model.to("vnpu")
    st.save_model(model, str(tmp_path / "model.safetensors"))
    st.save_file({"w": model[0].weight.detach()}, str(tmp_path / "w.safetensors"))
    assert calls == [str(tmp_path / "model.safetensors"), str(tmp_path / "w.safetensors")]
    back = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    back[1].weight = back[0].weight
    st.load_model(back, str(tmp_path / "model.safetensors"))
    assert torch.equal(back[0].weight, model[0].weight.cpu())
    assert torch.equal(st.load_file(str(tmp_path / "w.safetensors"))["w"], model[0].weight.cpu())
    # a CPU-only dict is safetensors' own business
    st.save_file({"c": torch.ones(2)}, str(tmp_path / "c.safetensors"))
    assert len(calls) == 2


def test_save_file_saves_the_values_as_of_the_call(tmp_path):
    """Downloads are queued on the tensors' stream: work queued before the call is in the file, work queued after it
    is not (a busy stream holds both back until after save_file was called)."""
    x = torch.zeros(1 << 16, device="vnpu")
    torch.vnpu._sleep(100_000_000)
    x.add_(1)  # queued before the save
    vio.save_file({"x": x}, tmp_path / "x.safetensors", chunk_bytes=4096, slots=2)
    x.add_(1)  # after
    assert st.load_file(str(tmp_path / "x.safetensors"))["x"].unique().tolist() == [1.0]
    assert x.unique().tolist() == [2.0]


def test_save_file_refuses_what_safetensors_refuses(tmp_path):
    x = torch.arange(12.0, device="vnpu").reshape(3, 4)
    with pytest.raises(ValueError, match="non contiguous"):
        vio.save_file({"t": x.t()}, tmp_path / "a.safetensors")
    with pytest.raises(RuntimeError, match="share memory"):
        vio.save_file({"a": x, "b": x[0]}, tmp_path / "a.safetensors")
    with pytest.raises(TypeError, match="'metadata': 'int' object is not an instance of 'str'"):
        vio.save_file({"a": x}, tmp_path / "a.safetensors", {"n": 1})
    with pytest.raises(TypeError, match="'tensor_dict': 'int' object is not an instance of 'str'"):
        vio.save_file({1: x}, tmp_path / "a.safetensors")
    with pytest.raises(ValueError, match="positive"):
        vio.save_file({"a": x}, tmp_path / "a.safetensors", chunk_bytes=0)
    assert os.listdir(tmp_path) == []


_SAVE_IN_A_CHILD = textwrap.dedent("""
    import torch, safetensors.torch as st
    from torch_vnpu.checkpoints import safetensors as vio
    torch.manual_seed(0)
    side = torch.vnpu.Stream()
    with torch.vnpu.stream(side):  # produced on another stream, handed over as CUDA code does
        state = {f"w{i}": torch.randn(300 + 7 * i, 129, device="vnpu").to(dt)
                 for i, dt in enumerate([torch.float32, torch.bfloat16, torch.float16, torch.int8] * 3)}
    torch.vnpu.current_stream().wait_stream(side)
    for v in state.values():
        v.record_stream(torch.vnpu.current_stream())
    vio.save_file(state, "out.safetensors", {"k": "v"}, chunk_bytes=CHUNK, slots=2)
    getattr(st.save_file, "__wrapped__", st.save_file)({k: v.cpu() for k, v in state.items()}, "ref.safetensors",
                                                       {"k": "v"})
    print(open("out.safetensors", "rb").read() == open("ref.safetensors", "rb").read())
""")


@pytest.mark.parametrize("env", [{"VNPU_FILE_WRITES": "0"}, {"VNPU_SANITIZE": "1"},
                                 {"VNPU_SANITIZE": "1", "VNPU_FILE_WRITES": "0"}],
                         ids=["staged", "sanitizer", "staged-sanitizer"])
def test_the_staged_path_and_the_sanitizer_save_the_same_bytes(tmp_path, env):
    """VNPU_FILE_WRITES=0: pinned staging buffers and downloads (what a runtime without file writes does); under
    the sanitizer (whose host-access check makes the device's writes go through a host buffer) neither path
    reports a race on tensors handed over from another stream. Small chunks split tensors and batch small ones."""
    assert _child(_SAVE_IN_A_CHILD.replace("CHUNK", "4096"), tmp_path, **env) == "True"


def test_a_save_takes_no_host_memory_beyond_a_tenth_of_the_checkpoint(tmp_path):
    """The device writes its memory into the file: the process's private (anonymous) memory does not grow with the
    checkpoint, where a save through CPU copies grows it by the whole checkpoint."""
    code = ("import torch\nfrom torch_vnpu.checkpoints import safetensors as vio\n"
            "def anon():\n"
            "    return next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('RssAnon'))\n"
            "state = {f'w{i}': torch.randn(512, 1024, device='vnpu') for i in range(32)}  # 64 MiB\n"
            "torch.vnpu.synchronize()\n"
            "before = anon()\n"
            "vio.save_file(state, 'c.safetensors')\n"
            "print((anon() - before) / 2**20)\n")
    assert float(_child(code, tmp_path)) <= 6.4


def test_saving_while_capturing_raises_the_capture_error_and_keeps_the_earlier_file(tmp_path):
    """A file written inside a graph capture would be written once, not at each replay: refused, as CUDA refuses a
    host read in a capture; the earlier file at the path stays, and the device stays usable."""
    x = torch.arange(1000.0, device="vnpu")
    path = tmp_path / "x.safetensors"
    vio.save_file({"x": x}, path)
    with pytest.raises(torch.AcceleratorError, match="capturing stream"):
        with torch.vnpu.graph(torch.vnpu.VNPUGraph()):
            vio.save_file({"y": x * 2}, path)
    torch.vnpu.synchronize()
    assert torch.equal(st.load_file(str(path))["x"], torch.arange(1000.0))
    assert os.listdir(tmp_path) == ["x.safetensors"]
    assert torch.equal((x * 2).cpu(), torch.arange(1000.0) * 2)


def test_a_failed_save_names_the_file_and_keeps_the_earlier_one(tmp_path):
    """A write that fails midway (here: the file size limit, as a full disk would) raises naming the file and the
    tensor; the checkpoint saved earlier at that path is untouched and no temporary file is left."""
    code = textwrap.dedent(f"""
        import os, resource, signal, torch
        from torch_vnpu.checkpoints import safetensors as vio
        path = "{tmp_path}/model.safetensors"
        with open(path, "wb") as f:
            f.write(b"earlier checkpoint")
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
        state = {{"a": torch.ones(1 << 16, device="vnpu"), "b": torch.ones(1 << 19, device="vnpu")}}
        try:
            vio.save_file(state, path, chunk_bytes=1 << 18)
            print("saved")
        except RuntimeError as e:
            print("error" if path in str(e) and "tensor 'b'" in str(e) else str(e))
        print(open(path, "rb").read().decode(), sorted(os.listdir("{tmp_path}")))
        print(state["b"].sum().item())
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["error", "earlier checkpoint ['model.safetensors']", str(float(1 << 19))], \
        proc.stdout


# ---------------------------------------------------------------- torch.load(map_location="vnpu")

from torch_vnpu import _C  # noqa: E402
from torch_vnpu.checkpoints import torch_load  # noqa: E402


def _torch_checkpoint(path):
    base = torch.randn(10, 10)
    obj = {"state": _state(), "param": torch.nn.Parameter(torch.randn(4, 5)), "base": base, "view": base[2:5, 1:],
           "nested": [torch.ones(3), {"flag": torch.zeros(2, dtype=torch.bool)}], "step": 5}
    torch.save(obj, path)
    return obj


def _count_reads(monkeypatch):
    calls = []
    real = _C._read_into_device
    monkeypatch.setattr(_C, "_read_into_device", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    return calls


@pytest.mark.parametrize("map_location,kwargs", [("vnpu", {}), ("vnpu:1", {"mmap": True}),
                                                 (torch.device("vnpu", 0), {"weights_only": False})])
def test_torch_load_onto_vnpu_reads_the_file_into_the_device(tmp_path, monkeypatch, map_location, kwargs):
    """Every dtype, a Parameter, a view sharing its base's storage, nested containers: equal to the CPU load, on the
    device, storages shared as in the file; each storage's bytes are read from the file into the device as torch
    restores it (no host copy)."""
    obj = _torch_checkpoint(tmp_path / "ckpt.pt")
    calls = _count_reads(monkeypatch)
    out = torch.load(tmp_path / "ckpt.pt", map_location=map_location, **kwargs)
    device = torch.device(map_location) if isinstance(map_location, str) else map_location
    assert len(calls) == len(obj["state"]) - 16 + 4  # the non-empty storages (16 empty), a read each
    assert all(len(segments) == 1 for segments in calls)
    for k, v in obj["state"].items():
        assert out["state"][k].device.index == (device.index or 0) and out["state"][k].dtype == v.dtype, k
        assert torch.equal(_bits(out["state"][k]), _bits(v)), k
    assert type(out["param"]) is torch.nn.Parameter and torch.equal(out["param"].cpu(), obj["param"])
    assert out["view"].untyped_storage().data_ptr() == out["base"].untyped_storage().data_ptr()
    assert torch.equal(out["view"].cpu(), obj["view"]) and out["view"].stride() == obj["view"].stride()
    assert out["nested"][1]["flag"].device.type == "vnpu" and out["step"] == 5


def test_other_torch_load_calls_are_torch_s_own(tmp_path, monkeypatch):
    import io

    obj = _torch_checkpoint(tmp_path / "ckpt.pt")
    torch.save({"w": torch.arange(6.0)}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    calls = _count_reads(monkeypatch)
    buf = io.BytesIO((tmp_path / "ckpt.pt").read_bytes())
    assert torch.load(buf, map_location="vnpu")["param"].device.type == "vnpu"  # a file object
    assert torch.load(tmp_path / "legacy.pt", map_location="vnpu")["w"].tolist() == [0, 1, 2, 3, 4, 5]
    assert torch.load(tmp_path / "ckpt.pt", map_location="cpu")["param"].device.type == "cpu"
    assert torch.load(tmp_path / "ckpt.pt", map_location={"cpu": "vnpu:1"})["param"].device == torch.device("vnpu", 1)
    assert calls == []
    with pytest.raises(RuntimeError, match="mmap can only be used"):  # torch's own error for a legacy file
        torch.load(tmp_path / "legacy.pt", map_location="cpu", mmap=True)


def test_work_queued_after_torch_load_reads_the_loaded_bytes(tmp_path):
    obj = _torch_checkpoint(tmp_path / "ckpt.pt")
    torch.vnpu._sleep(200_000_000)  # every upload is still queued when torch.load returns
    out = torch.load(tmp_path / "ckpt.pt", map_location="vnpu")
    assert out["param"].double().sum().item() == obj["param"].double().sum().item()


def test_a_failed_torch_load_names_the_file_and_frees_what_it_loaded(tmp_path, monkeypatch):
    """A read past the end of the file (as when the file shrinks while it is read) raises naming the file; the
    storages loaded so far are freed."""
    _torch_checkpoint(tmp_path / "ckpt.pt")
    real = torch_load._FileMap.offset
    seen = []

    def offset(self, address):
        seen.append(address)
        return real(self, address) if len(seen) < 5 else os.path.getsize(self.path) - 2

    monkeypatch.setattr(torch_load._FileMap, "offset", offset)
    gc.collect()  # earlier tests' tensors still in reference cycles would be freed by the load's own collection
    torch.vnpu.synchronize()
    before = torch.vnpu.memory_allocated()
    with pytest.raises(RuntimeError, match="ckpt.pt"):
        torch.load(tmp_path / "ckpt.pt", map_location="vnpu")
    torch.vnpu.synchronize()
    assert torch.vnpu.memory_allocated() == before


# ---------------------------------------------------------------- progress and Ctrl-C

def test_loads_and_saves_report_progress_to_the_end(checkpoint, tmp_path, monkeypatch):
    from torch_vnpu.checkpoints import _progress

    seen = []
    real = _progress._Bar.callback
    monkeypatch.setattr(_progress._Bar, "callback", lambda self, done: seen.append(done) or real(self, done))
    out = vio.load_file(checkpoint, "vnpu", chunk_bytes=4096)
    data = sum(v.numel() * v.element_size() for v in out.values())
    assert seen and seen == sorted(seen) and seen[-1] == data and len(seen) > 3
    seen.clear()
    vio.save_file(out, tmp_path / "copy.safetensors", chunk_bytes=4096)
    assert seen and seen == sorted(seen) and seen[-1] == data


def test_ctrl_c_during_a_load_or_a_save_stops_it_and_loses_nothing(checkpoint, tmp_path, monkeypatch):
    """KeyboardInterrupt raised while the file is read (here from the progress report, where a SIGINT is seen)
    ends the load with nothing left allocated, and a save with the earlier file kept; the device stays usable."""
    from torch_vnpu.checkpoints import _progress

    def interrupt(self, done):
        raise KeyboardInterrupt

    state = vio.load_file(checkpoint, "vnpu")
    (tmp_path / "kept.safetensors").write_bytes(b"earlier")
    torch.vnpu.synchronize()
    before = torch.vnpu.memory_allocated()
    monkeypatch.setattr(_progress._Bar, "callback", interrupt)
    with pytest.raises(KeyboardInterrupt):
        vio.load_file(checkpoint, "vnpu", chunk_bytes=4096)
    with pytest.raises(KeyboardInterrupt):
        vio.save_file(state, tmp_path / "kept.safetensors", chunk_bytes=4096)
    torch.vnpu.synchronize()
    assert torch.vnpu.memory_allocated() == before
    assert sorted(os.listdir(tmp_path)) == ["kept.safetensors"]
    assert (tmp_path / "kept.safetensors").read_bytes() == b"earlier"
    assert (torch.arange(3, device="vnpu") * 2).tolist() == [0, 2, 4]


# ---------------------------------------------------------------- transformers' from_pretrained

@pytest.mark.parametrize("device_map,dtype", [("vnpu", None), ("vnpu:1", torch.bfloat16)])
def test_from_pretrained_onto_vnpu_reads_the_weights_into_the_device(tmp_path, monkeypatch, device_map, dtype):
    """A sharded checkpoint loaded with device_map=<vnpu>: every weight read from the files into device memory
    (converted on the device when a dtype is asked for), equal to the CPU load."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=100)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path, max_shard_size="40KB")
    assert len(list(tmp_path.glob("*.safetensors"))) > 2  # sharded
    ref = LlamaForCausalLM.from_pretrained(tmp_path)
    calls = _count_reads(monkeypatch)
    model = LlamaForCausalLM.from_pretrained(tmp_path, device_map=device_map, **({} if dtype is None else
                                                                                  {"dtype": dtype}))
    state = model.state_dict()
    assert len(calls) == len(dict(model.named_parameters()))
    for k, v in ref.state_dict().items():
        assert state[k].device == torch.device(device_map if ":" in device_map else "vnpu:0"), k
        assert torch.equal(state[k].cpu(), v if dtype is None else v.to(dtype)), k


def _llama_checkpoint(path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=100)
    LlamaForCausalLM(cfg).save_pretrained(path, max_shard_size="40KB")
    return LlamaForCausalLM.from_pretrained(path).eval()


@pytest.mark.parametrize("device_map,max_memory,placed", [
    ("auto", None, {0, 1}),                      # as with two GPUs: balanced over both
    ("sequential", None, {0}),                   # fills device 0 first
    ("auto", {0: "300KB", "cpu": "1GB"}, {0, "cpu"}),  # device 0 full: the rest offloaded to the CPU
    ("balanced", {0: "2MB", 1: "2MB"}, {0, 1}),
])
def test_from_pretrained_with_an_automatic_device_map_places_weights_on_vnpu(tmp_path, monkeypatch, device_map,
                                                                            max_memory, placed):
    """device_map="auto" / "balanced" / "sequential" measures the vnpu devices as accelerate measures CUDA's (it
    knew only listed devices and put every weight on the CPU): weights land on vnpu devices by index (read from
    the files into device memory), and are offloaded to the CPU when max_memory says so (accelerate's CPU
    offload, run on vnpu:0 as on cuda:0); the model's logits equal the CPU model's."""
    from transformers import LlamaForCausalLM

    ref = _llama_checkpoint(tmp_path)
    assert torch.vnpu.device_count() >= 2
    calls = _count_reads(monkeypatch)
    model = LlamaForCausalLM.from_pretrained(tmp_path, device_map=device_map, max_memory=max_memory).eval()
    # (transformers sets hf_device_map only when the map has more than one entry)
    device_map_ = getattr(model, "hf_device_map", {"": next(model.parameters()).device.index})
    assert set(device_map_.values()) == placed, device_map_
    assert {str(p.device) for p in model.parameters()} - {"meta"} == {f"vnpu:{i}" for i in placed if i != "cpu"}
    on_vnpu = [n for n, p in model.named_parameters() if p.device.type == "vnpu"]
    assert len(calls) == len(on_vnpu)
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(ids).logits
        got = model(ids.to(model.device)).logits.cpu()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_device_map_auto_spills_to_the_cpu_when_the_devices_are_full(tmp_path):
    """Small devices (VNPU_MEMORY_PER_DEVICE=64M, a 124 MB model): "auto" fills both vnpu devices and offloads the
    rest to the CPU instead of raising OutOfMemoryError (the caching allocator rounds a request up to a 20 MiB
    segment, so a device filled to the byte could not load its share); the logits equal the CPU model's."""
    code = textwrap.dedent("""
        import collections, warnings, torch
        warnings.simplefilter("ignore")
        from transformers import LlamaConfig, LlamaForCausalLM
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=8000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                          num_attention_heads=8, num_key_value_heads=2)
        ref = LlamaForCausalLM(cfg).eval()
        ref.save_pretrained("ck")
        model = LlamaForCausalLM.from_pretrained("ck", device_map="auto").eval()
        placed = collections.Counter(str(p.device) for p in model.parameters())
        ids = torch.randint(0, 8000, (1, 8), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            same = torch.allclose(model(ids.to("vnpu:0")).logits.cpu(), ref(ids).logits, rtol=1e-5, atol=1e-5)
        print(sorted(placed), same)
    """)
    assert _child(code, tmp_path, VNPU_MEMORY_PER_DEVICE="64M") == "['meta', 'vnpu:0', 'vnpu:1'] True"


def _same_size_other_layout(path, keep_stat=None):
    """Rewrite the safetensors file at ``path`` in place (same inode, same size) with "a" and "b" swapped between
    float32 and int32, and, given an os.stat result, its times set back to that (a rewrite within one clock tick)."""
    a, b = torch.arange(4, dtype=torch.float32) + 0.25, torch.arange(4, dtype=torch.int32) + 100
    data = st.save({"a": b, "b": a})
    with open(path, "r+b") as f:
        f.write(data)
    if keep_stat is not None:
        os.utime(path, ns=(keep_stat.st_atime_ns, keep_stat.st_mtime_ns))
    return data


def test_a_file_rewritten_at_the_same_path_is_read_with_its_own_header(tmp_path):
    """A file rewritten in place with the same size and time (the header cache's file identity unchanged) and a
    file renamed over the path (what save_file does) are read with their own layout: the vnpu tensor equals
    safetensors' CPU read of the same file."""
    path = str(tmp_path / "m.safetensors")
    a, b = torch.arange(4, dtype=torch.float32) + 0.25, torch.arange(4, dtype=torch.int32) + 100
    for rewrite in ("in place", "renamed over"):
        st.save_file({"a": a, "b": b}, path)
        with safetensors.safe_open(path, framework="pt", device="vnpu") as f:
            assert torch.equal(f.get_tensor("a").cpu(), a)
        assert vio.load_file(path)["a"].dtype == torch.float32
        if rewrite == "in place":
            _same_size_other_layout(path, keep_stat=os.stat(path))
        else:
            st.save_file({"a": b, "b": a}, path)
        ref = st.load_file(path)
        for got in (vio.load_file(path), {"a": safetensors.safe_open(path, framework="pt", device="vnpu").get_tensor("a")}):
            assert got["a"].dtype == ref["a"].dtype == torch.int32 and torch.equal(got["a"].cpu(), ref["a"]), rewrite


def test_a_safe_open_handle_reads_the_file_it_opened(tmp_path):
    """A handle opened before another file is renamed over the path reads the file it opened, as safetensors' own
    handle (its memory map) does, header and data alike."""
    path = str(tmp_path / "m.safetensors")
    a, b = torch.arange(4, dtype=torch.float32) + 0.25, torch.arange(4, dtype=torch.int32) + 100
    st.save_file({"a": a, "b": b}, path)
    with safetensors.safe_open(path, framework="pt", device="vnpu") as f, \
            safetensors.safe_open(path, framework="pt", device="cpu") as ref:
        st.save_file({"a": b, "b": a}, path)  # renamed over the path
        got = f.get_tensor("a")
        assert got.dtype == ref.get_tensor("a").dtype == torch.float32 and torch.equal(got.cpu(), ref.get_tensor("a"))
        assert torch.equal(got.cpu(), a)


def test_a_safe_open_handle_closed_by_with_is_closed_as_safetensors_own(tmp_path):
    """After ``with safe_open(..., device="vnpu")`` get_tensor raises safetensors' own error, as on CPU, and the
    handle holds no file open any more."""
    path = str(tmp_path / "m.safetensors")
    st.save_file({"w": torch.arange(4.0)}, path)
    torch.ones(1, device="vnpu").cpu()  # the device's own descriptors opened first

    def open_files():
        return sum(1 for fd in os.listdir("/proc/self/fd") if os.path.realpath(f"/proc/self/fd/{fd}") == path)

    errors = {}
    for device in ("cpu", "vnpu"):
        with safetensors.safe_open(path, framework="pt", device=device) as f:
            assert torch.equal(f.get_tensor("w").cpu(), torch.arange(4.0))
        with pytest.raises(Exception) as e:
            f.get_tensor("w")
        errors[device] = (type(e.value), str(e.value))
        assert open_files() == 0, device
    assert errors["vnpu"] == errors["cpu"]


def test_a_conversion_on_load_needs_device_memory_for_the_requested_dtype_only(tmp_path):
    """load_file(dtype=) and from_pretrained(dtype=) convert a tensor on the device a chunk at a time: a float32
    checkpoint loaded as bfloat16 takes the bfloat16 size plus one 16 MiB scratch buffer, not both copies of a
    tensor; the values are the CPU load's, converted."""
    path = str(tmp_path / "big.safetensors")
    state = {"emb": torch.randn(3000, 4096), "norm": torch.randn(4096), "ids": torch.arange(10)}  # emb: 47 MiB
    st.save_file(state, path)
    torch.vnpu.synchronize()
    torch.vnpu.empty_cache()
    torch.vnpu.reset_peak_memory_stats()
    base = torch.vnpu.memory_allocated()
    out = vio.load_file(path, "vnpu", dtype=torch.bfloat16)
    torch.vnpu.synchronize()
    wanted = sum(v.numel() * (2 if v.is_floating_point() else v.element_size()) for v in state.values())
    # (+ 2 MiB: a large block is not split for a remainder under 1 MiB, the caching allocator's rounding)
    assert torch.vnpu.max_memory_allocated() - base <= wanted + (16 << 20) + (2 << 20)
    for k, v in state.items():
        want = v.to(torch.bfloat16) if v.is_floating_point() else v
        assert out[k].dtype == want.dtype and torch.equal(out[k].cpu(), want), k


def test_from_pretrained_in_a_smaller_dtype_fits_a_device_the_stored_dtype_does_not(tmp_path):
    """A float32 checkpoint of 76 MiB loaded with dtype=float16 onto 64 MiB devices (38 MiB in float16; its
    embedding alone is 59 MiB in float32): on vnpu:0 whole with device_map="vnpu", and on the vnpu devices with
    device_map="auto" (where accelerate's balancing puts it); the weights equal the CPU load's in float16."""
    code = textwrap.dedent("""
        import collections, gc, warnings, torch
        warnings.simplefilter("ignore")
        from transformers import LlamaConfig, LlamaForCausalLM
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=30000, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                          num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True)
        LlamaForCausalLM(cfg).save_pretrained("ck")
        ref = LlamaForCausalLM.from_pretrained("ck", dtype=torch.float16).eval()
        for device_map in ("vnpu", "auto"):
            model = LlamaForCausalLM.from_pretrained("ck", dtype=torch.float16, device_map=device_map).eval()
            placed = sorted(collections.Counter(str(p.device) for p in model.parameters()))
            same = all(torch.equal(p.cpu(), q) for p, q in zip(model.state_dict().values(), ref.state_dict().values())
                       if p.device.type != "meta")
            print(device_map, placed, same)
            del model
            gc.collect()
    """)
    out = _child(code, tmp_path, VNPU_MEMORY_PER_DEVICE="64M").splitlines()
    assert out[0] == "vnpu ['vnpu:0'] True"
    assert out[1].startswith("auto ['vnpu:") and out[1].endswith(" True") and "cpu" not in out[1]


def test_safe_open_get_tensor_onto_vnpu_reads_into_the_device(checkpoint, monkeypatch):
    calls = _count_reads(monkeypatch)
    ref = st.load_file(checkpoint, device="cpu")
    with safetensors.safe_open(checkpoint, framework="pt", device="vnpu:1") as f:
        keys = list(f.keys())
        out = {k: f.get_tensor(k) for k in keys}
        with pytest.raises(Exception, match="nope"):
            f.get_tensor("nope")  # safetensors' own error
    assert sorted(keys) == sorted(ref) and len(calls) == sum(1 for v in ref.values() if v.numel())
    for k, v in ref.items():
        assert out[k].device == torch.device("vnpu", 1) and torch.equal(_bits(out[k]), _bits(v)), k


def _big_endian(src, dst, keep_record=True):
    """The torch.save file ``src`` of 4-byte tensors as torch.save writes it on a big-endian host: data byteswapped,
    the byteorder record saying "big" (or no record)."""
    import zipfile

    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith("/byteorder"):
                if not keep_record:
                    continue
                data = b"big"
            elif "/data/" in info.filename and not info.filename.endswith("serialization_id"):
                data = bytes(torch.frombuffer(bytearray(data), dtype=torch.uint8).view(-1, 4).flip(1).reshape(-1))
            zout.writestr(info, data)


@pytest.mark.parametrize("record", [True, False])
def test_torch_load_of_a_big_endian_file_gives_the_values(tmp_path, monkeypatch, record):
    """A file written on a big-endian host (a "big" byteorder record, or none with the default load endianness
    set to BIG): torch.load byteswaps the storages; onto vnpu the values are the saved ones too (torch's own path:
    the bytes in the file are not the tensors')."""
    x, i = torch.arange(6, dtype=torch.float32) + 0.5, torch.arange(4, dtype=torch.int32) + 7
    torch.save({"x": x, "i": i}, tmp_path / "le.pt")
    _big_endian(tmp_path / "le.pt", tmp_path / "be.pt", keep_record=record)
    if not record:
        old = torch.serialization.get_default_load_endianness()
        torch.serialization.set_default_load_endianness(torch.serialization.LoadEndianness.BIG)
    try:
        cpu = torch.load(tmp_path / "be.pt")
        calls = _count_reads(monkeypatch)
        out = torch.load(tmp_path / "be.pt", map_location="vnpu")
    finally:
        if not record:
            torch.serialization.set_default_load_endianness(old)
    assert torch.equal(cpu["x"], x) and torch.equal(cpu["i"], i)
    assert out["x"].device.type == "vnpu" and torch.equal(out["x"].cpu(), x) and torch.equal(out["i"].cpu(), i)
    assert calls == []


def test_torch_load_reads_the_file_it_checked(tmp_path, monkeypatch):
    """A big-endian file renamed over the path right after the little-endian file there was checked (streamable):
    the load reads the file it checked and opened, with its values, not the other file's raw bytes."""
    from torch_vnpu.checkpoints import torch_load

    x = torch.arange(8, dtype=torch.float32) + 0.25
    torch.save({"x": x}, tmp_path / "le.pt")
    _big_endian(tmp_path / "le.pt", tmp_path / "be.pt")
    os.link(tmp_path / "le.pt", tmp_path / "ckpt.pt")
    checked = torch_load._readable_in_place

    def check_then_rename(path):
        ok = checked(path)
        os.replace(tmp_path / "be.pt", tmp_path / "ckpt.pt")
        return ok

    monkeypatch.setattr(torch_load, "_readable_in_place", check_then_rename)
    out = torch.load(tmp_path / "ckpt.pt", map_location="vnpu")
    assert torch.equal(out["x"].cpu(), x)


def test_a_file_truncated_while_torch_load_reads_it_raises(tmp_path):
    """The file shrinks during the load (here from a __setstate__; another process rewriting it in place does the
    same): RuntimeError naming the file, as the CPU load raises one, not a storage torch would resize to garbage."""
    code = textwrap.dedent("""
        import os, torch, torch_vnpu

        class Truncates:
            def __init__(self):
                self.state = 1  # (an empty state would not be passed to __setstate__)

            def __setstate__(self, state):
                os.truncate("ckpt.pt", 100)

        torch.full((5000,), 123.0, device="vnpu")  # freed memory with a pattern in it
        for device in ("cpu", "vnpu"):
            torch.save({"a": torch.randn(3000), "t": Truncates(), "b": torch.randn(5000)}, "ckpt.pt")
            try:
                torch.load("ckpt.pt", map_location=device, weights_only=False)
                print(device, "returned")
            except RuntimeError as e:
                print(device, "raised", "ckpt.pt" in str(e) or device == "cpu")
        print(torch.vnpu.memory_allocated())
    """)
    assert _child(code, tmp_path).splitlines() == ["cpu raised True", "vnpu raised True", "0"]


def test_a_record_header_pointing_past_the_end_of_the_file_raises(tmp_path):
    """A corrupt local header (its extra-field length pushes the data past the end of the file): torch.load onto
    vnpu raises RuntimeError naming the file, as the CPU load raises, and leaves nothing allocated (torch would
    otherwise resize the empty slice it got to memory never read)."""
    import struct

    torch.save({"a": torch.arange(1000.0), "b": torch.ones(3)}, tmp_path / "ckpt.pt")
    data = bytearray((tmp_path / "ckpt.pt").read_bytes())
    pos = 0
    while True:  # the local header of the first storage's record
        pos = data.index(b"PK\x03\x04", pos)
        n = struct.unpack_from("<H", data, pos + 26)[0]
        if data[pos + 30:pos + 30 + n].endswith(b"/data/0"):
            break
        pos += 4
    struct.pack_into("<H", data, pos + 28, 60000)
    (tmp_path / "bad.pt").write_bytes(bytes(data))
    with pytest.raises(RuntimeError):
        torch.load(tmp_path / "bad.pt", map_location="cpu", mmap=True)
    gc.collect()
    torch.vnpu.synchronize()
    before = torch.vnpu.memory_allocated()
    with pytest.raises(RuntimeError, match=f"{tmp_path / 'bad.pt'}: the storage at byte .* runs to the end"):
        torch.load(tmp_path / "bad.pt", map_location="vnpu")
    gc.collect()
    assert torch.vnpu.memory_allocated() == before


@pytest.mark.parametrize("last", [False, True])
def test_a_record_shorter_than_its_storage_raises(tmp_path, last):
    """A file rewritten with a storage's record cut short (as the last record before the zip directory or not):
    torch.load onto vnpu raises RuntimeError naming the file, as torch.load to CPU does ("record size ... does not
    match"), instead of reading the next record's bytes into the storage's tail."""
    import zipfile

    torch.save({"a": torch.arange(16, dtype=torch.float32), "b": torch.arange(4)}, tmp_path / "ckpt.pt")
    with zipfile.ZipFile(tmp_path / "ckpt.pt") as z:
        entries = [(i.filename, z.read(i.filename)) for i in z.infolist()]
    if last:
        entries.sort(key=lambda e: e[0].endswith("/data/0"))
    with zipfile.ZipFile(tmp_path / "short.pt", "w", zipfile.ZIP_STORED) as z:
        for name, data in entries:
            z.writestr(name, data[:-8] if name.endswith("/data/0") else data)
    with pytest.raises(RuntimeError, match="record size"):
        torch.load(tmp_path / "short.pt", map_location="cpu")
    with pytest.raises(RuntimeError, match=f"{tmp_path / 'short.pt'}: the storage at byte .* not one whole record"):
        torch.load(tmp_path / "short.pt", map_location="vnpu")


def test_what_unpickling_computes_from_a_loaded_tensor_sees_its_bytes(tmp_path):
    """Each storage is in device memory by the time torch.load hands it on: a __setstate__ that computes from its
    tensor, and a nested tensor (rebuilt from its sizes tensor, weights_only=True) after device memory was used
    and freed, load as on CPU."""
    code = textwrap.dedent("""
        import torch, torch_vnpu

        class Normalizer:
            def __init__(self, w):
                self.w = w
            def __getstate__(self):
                return {"w": self.w}
            def __setstate__(self, state):
                self.w = state["w"]
                self.scale = self.w.abs().max()
                self.positive = self.w > 0

        torch.manual_seed(0)
        torch.save(Normalizer(torch.randn(1000)), "obj.pt")
        cpu = torch.load("obj.pt", weights_only=False)
        dev = torch.load("obj.pt", map_location="vnpu", weights_only=False)
        print(torch.equal(dev.scale.cpu(), cpu.scale), torch.equal(dev.positive.cpu(), cpu.positive))
        torch.save(torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)]), "nested.pt")
        for _ in range(3):
            torch.full((4096,), -7.0e18, device="vnpu")  # freed memory with garbage in it, reused by the load
            nt = torch.load("nested.pt", map_location="vnpu", weights_only=True)
            ref = torch.load("nested.pt", weights_only=True)
            print(all(torch.equal(a.cpu(), b) for a, b in zip(nt.unbind(), ref.unbind())))
    """)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _child(code, tmp_path).splitlines() == ["True True", "True", "True", "True"]


def test_torch_load_of_files_it_cannot_read_in_place_is_torch_s_own(tmp_path, monkeypatch):
    """A torch.save file re-zipped with compression (its bytes are not the tensors' at their offsets) and a
    TorchScript archive keep torch.load's path; so does a name torch cannot memory-map (not UTF-8); a file whose
    memory map is not found (a newline in its name) is copied per storage. Values equal the CPU load."""
    import zipfile

    obj = _torch_checkpoint(tmp_path / "ckpt.pt")
    with zipfile.ZipFile(tmp_path / "ckpt.pt") as src, \
            zipfile.ZipFile(tmp_path / "deflated.pt", "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
    torch.jit.save(torch.jit.script(torch.nn.Linear(3, 2)), tmp_path / "scripted.pt")
    calls = _count_reads(monkeypatch)
    out = torch.load(tmp_path / "deflated.pt", map_location="vnpu")
    assert torch.equal(out["param"].cpu(), obj["param"]) and out["param"].device.type == "vnpu"
    scripted = torch.load(tmp_path / "scripted.pt", map_location="vnpu", weights_only=False)
    assert isinstance(scripted, torch.jit.ScriptModule) and scripted.weight.device.type == "vnpu"
    assert calls == []
    for name in ("new\nline.pt", os.fsdecode(b"bytes\xff.pt")):
        os.link(tmp_path / "ckpt.pt", tmp_path / name)
        out = torch.load(tmp_path / name, map_location="vnpu")
        assert torch.equal(out["param"].cpu(), obj["param"]) and out["param"].device.type == "vnpu", name
    assert calls == []
