"""torch.distributed.checkpoint.load onto vnpu reads each tensor's bytes from the .distcp file into its target
(torch_vnpu.checkpoints.dcp). Oracle: the state dict that was saved (bitwise), DCP's own reader for the items it
keeps (CPU targets, non-contiguous chunks, dtype changes). Resharded multi-rank loads (FSDP2 -> tensor parallel)
are in test_distributed_parallel.py."""

import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int8,
          torch.uint8, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2, torch.complex64]


def _state(seed):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i, dtype in enumerate(DTYPES):
        for j, shape in enumerate(((), (0, 3), (7,), (33, 5), (2, 3, 129))):
            x = torch.randn(shape, generator=g, dtype=torch.float64) * 50
            t = x > 0 if dtype == torch.bool else torch.complex(x, -x) if dtype.is_complex else x
            out[f"t{i}_{j}"] = t.to(dtype)
    out["step"] = 7  # a bytes item
    return out


def _bits(t):
    t = t.cpu().contiguous()
    return t.reshape(-1).view(torch.uint8) if t.numel() else t


def _no_pg_load(sd, path):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*single process.*")
        dcp.load(sd, checkpoint_id=path)


def _no_pg_save(sd, path):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*single process.*")
        dcp.save(sd, checkpoint_id=path)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("dcp") / "ckpt")
    _no_pg_save({k: v.to("vnpu") if isinstance(v, torch.Tensor) else v for k, v in _state(0).items()}, path)
    return path


def _count_host_loads(monkeypatch):
    """The records DCP's own reader builds in host memory (torch.load onto the CPU)."""
    calls = []
    original = torch.load

    def load(f, map_location=None, *args, **kwargs):
        if map_location == "cpu":
            calls.append(f)
        return original(f, map_location, *args, **kwargs)

    monkeypatch.setattr(torch, "load", load)
    return calls


def test_every_dtype_is_read_into_the_device_bitwise(checkpoint, monkeypatch):
    host_loads = _count_host_loads(monkeypatch)
    saved = _state(0)
    sd = {k: torch.zeros_like(v, device="vnpu") if isinstance(v, torch.Tensor) else 0 for k, v in saved.items()}
    _no_pg_load(sd, checkpoint)
    assert host_loads == []  # no record went through host memory
    assert sd["step"] == 7
    for k, v in saved.items():
        if isinstance(v, torch.Tensor):
            assert sd[k].device.type == "vnpu" and sd[k].dtype == v.dtype and sd[k].shape == v.shape, k
            assert torch.equal(_bits(sd[k]), _bits(v)), k


def test_targets_the_file_cannot_fill_in_place_go_through_dcp_s_reader(checkpoint, monkeypatch):
    """A CPU target, a transposed (non-contiguous) vnpu target and a vnpu target of another dtype: DCP's own
    reader, with its results (the CPU load of the same checkpoint)."""
    host_loads = _count_host_loads(monkeypatch)
    saved = _state(0)
    sd = {"t1_3": torch.zeros(5, 33, device="vnpu").t(),  # float32 (33, 5), non-contiguous
          "t0_3": torch.zeros(33, 5, dtype=torch.float32, device="vnpu"),  # float64 saved: converted on load
          "t3_4": torch.zeros(2, 3, 129, dtype=torch.bfloat16),  # CPU
          "t4_2": torch.zeros(7, dtype=torch.int64, device="vnpu")}  # read into the device
    _no_pg_load(sd, checkpoint)
    assert len(host_loads) == 3
    assert not sd["t1_3"].is_contiguous() and torch.equal(sd["t1_3"].cpu(), saved["t1_3"])
    assert sd["t0_3"].dtype == torch.float32 and torch.equal(sd["t0_3"].cpu(), saved["t0_3"].float())
    assert torch.equal(sd["t3_4"], saved["t3_4"]) and torch.equal(sd["t4_2"].cpu(), saved["t4_2"])


def test_the_load_is_ordered_after_earlier_work_and_before_later_work(checkpoint):
    saved = _state(0)["t1_4"]
    target = torch.full(saved.shape, 3.0, device="vnpu")
    big = torch.randn(512, 512, device="vnpu")
    for _ in range(20):  # keep the stream busy, then queue a write of the target behind it
        big = big @ big / 512
    target.mul_(2)
    _no_pg_load({"t1_4": target}, checkpoint)
    twice = target * 2  # queued right after the load returned
    assert torch.equal(target.cpu(), saved) and torch.equal(twice.cpu(), saved * 2)


def test_a_truncated_file_names_the_file_and_the_tensor(checkpoint, tmp_path):
    import shutil

    broken = str(tmp_path / "broken")
    shutil.copytree(checkpoint, broken)
    info = next(v for k, v in dcp.FileSystemReader(broken).read_metadata().storage_data.items() if k.fqn == "t2_4")
    with open(os.path.join(broken, info.relative_path), "r+b") as f:
        f.truncate(info.offset + info.length - 100)  # inside the tensor's record
    sd = {"t2_4": torch.zeros(2, 3, 129, dtype=torch.float16, device="vnpu")}
    from torch.distributed.checkpoint.api import CheckpointException

    with pytest.raises(CheckpointException) as e:  # DCP's wrapper of a reader's error, as for its own reader
        _no_pg_load(sd, broken)
    assert f"{info.relative_path}: the record of tensor 't2_4'" in str(e.value)
    torch.vnpu.synchronize()  # the device stays usable
    assert (torch.ones(3, device="vnpu") * 2).sum().item() == 6


def test_the_sanitizer_sees_no_race_in_a_load_then_use(checkpoint, tmp_path):
    code = ("import warnings, torch, torch.distributed.checkpoint as dcp\n"
            "warnings.simplefilter('ignore')\n"
            "sd = {'t1_4': torch.zeros(2, 3, 129, device='vnpu'), 't3_3': torch.zeros(33, 5, dtype=torch.bfloat16, "
            "device='vnpu')}\n"
            f"dcp.load(sd, checkpoint_id={checkpoint!r})\n"
            "print((sd['t1_4'].double().sum() + sd['t3_3'].double().sum()).item())\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, VNPU_SANITIZE="1"), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = _state(0)
    assert float(proc.stdout.strip()) == (s["t1_4"].double().sum() + s["t3_3"].double().sum()).item()


def test_a_file_cut_inside_the_first_record_says_where_it_ends(checkpoint, tmp_path):
    import shutil

    from torch.distributed.checkpoint.api import CheckpointException

    broken = str(tmp_path / "broken")
    shutil.copytree(checkpoint, broken)
    info = next(v for k, v in dcp.FileSystemReader(broken).read_metadata().storage_data.items() if k.fqn == "t2_4")
    with open(os.path.join(broken, info.relative_path), "r+b") as f:
        f.truncate(100)
    with pytest.raises(CheckpointException) as e:
        _no_pg_load({"t2_4": torch.zeros(2, 3, 129, dtype=torch.float16, device="vnpu")}, broken)
    assert "cannot be read: " in str(e.value) and "the file ends at byte 100" in str(e.value)


def test_records_with_compressed_or_foreign_byte_order_entries_are_not_read_as_raw_bytes():
    """A record whose tensor entry is deflated (DCP never writes one, a rewritten file may) or whose bytes are in
    the other byte order goes to DCP's reader, which decodes it."""
    import io
    import zipfile

    from torch_vnpu.checkpoints._archive import raw_bytes

    raw = io.BytesIO()
    torch.save(torch.arange(1000.0), raw)
    assert raw_bytes(io.BytesIO(raw.getvalue()))

    def rewritten(compress, order=None):
        out = io.BytesIO()
        with zipfile.ZipFile(io.BytesIO(raw.getvalue())) as src, zipfile.ZipFile(out, "w") as dst:
            for i in src.infolist():
                data = src.read(i)
                if i.filename.endswith("/byteorder") and order is not None:
                    data = order
                dst.writestr(i.filename, data, compress_type=compress if "/data/" in i.filename else zipfile.ZIP_STORED)
        return io.BytesIO(out.getvalue())

    assert raw_bytes(rewritten(zipfile.ZIP_STORED))
    assert not raw_bytes(rewritten(zipfile.ZIP_DEFLATED))
    other = b"big" if sys.byteorder == "little" else b"little"
    assert not raw_bytes(rewritten(zipfile.ZIP_STORED, other))


def _save_from_another_device(path):
    x = torch.zeros(1 << 20, device="vnpu:1")
    with torch.vnpu.device(1):  # the value is written behind slow work on vnpu:1's stream
        a = torch.randn(1024, 1024, device="vnpu:1")
        for _ in range(10):
            a = a @ a / 1024
        x.add_(a.sum() * 0 + 7)
    _no_pg_save({"x": x}, path)  # vnpu:0 is current
    back = {"x": torch.zeros(1 << 20)}
    _no_pg_load(back, path)
    return back["x"]


def test_dcp_save_of_a_tensor_on_another_device_waits_for_its_staging_copy(tmp_path):
    """DCP stages with non_blocking copies and synchronizes the current device only: the copy on vnpu:1 is waited
    for too (it was a silent stale checkpoint, as it is on CUDA)."""
    assert torch.vnpu.current_device() == 0
    assert torch.equal(_save_from_another_device(str(tmp_path / "c")), torch.full((1 << 20,), 7.0))


def test_the_same_under_the_sanitizer(tmp_path):
    code = ("import sys; sys.path.insert(0, %r)\n"
            "import test_checkpoint_dcp as t, torch\n"
            "print(torch.equal(t._save_from_another_device(%r), torch.full((1 << 20,), 7.0)))\n"
            % (os.path.dirname(__file__), str(tmp_path / "c")))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, VNPU_SANITIZE="1"), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "True"
