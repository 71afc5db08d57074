"""Legacy typed storage classes torch.vnpu.FloatStorage, ... as torch.cuda provides torch.cuda.FloatStorage, ...:
``x.storage_type()``, ``x.storage().type()``, ``isinstance`` checks and construction behave as on CUDA (the
CPU classes ``torch.FloatStorage``, ... are the oracle for the names and dtypes)."""
import warnings

import pytest
import torch

# Every legacy class CUDA defines (torch/cuda/__init__.py), with its dtype.
LEGACY = {
    "BFloat16Storage": torch.bfloat16, "BoolStorage": torch.bool, "ByteStorage": torch.uint8,
    "CharStorage": torch.int8, "ComplexDoubleStorage": torch.cdouble, "ComplexFloatStorage": torch.cfloat,
    "DoubleStorage": torch.double, "FloatStorage": torch.float, "HalfStorage": torch.half,
    "IntStorage": torch.int, "LongStorage": torch.long, "ShortStorage": torch.short,
}


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TypedStorage is deprecated")
        yield


@pytest.mark.parametrize("name", sorted(LEGACY))
def test_storage_type_names_the_vnpu_class(name):
    dtype = LEGACY[name]
    x = torch.zeros(3, dtype=dtype, device="vnpu")
    cls = getattr(torch.vnpu, name)
    assert x.storage_type() is cls
    assert cls.__name__ == getattr(torch, name).__name__ == name  # same names as the CPU (and CUDA) classes
    assert x.storage().type() == f"torch.vnpu.{name}"
    assert isinstance(x.storage(), cls)
    assert not isinstance(x.cpu().storage(), cls)
    assert isinstance(x.cpu().storage(), getattr(torch, name))
    assert cls.dtype == dtype
    assert name in torch.vnpu.__all__


def test_storage_of_a_vnpu_tensor_is_typed_storage_as_on_cuda():
    x = torch.arange(4.0, device="vnpu")
    s = x.storage()
    assert type(s) is torch.storage.TypedStorage  # as type(cuda_tensor.storage()) on CUDA
    assert s.device == x.device and s.dtype == torch.float32 and s.size() == 4
    assert s.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_constructing_a_legacy_storage_allocates_on_vnpu():
    s = torch.vnpu.DoubleStorage(5)
    assert s.device == torch.device("vnpu:0") and s.dtype == torch.float64 and s.size() == 5
    s.fill_(2.5)
    assert s.tolist() == [2.5] * 5
    t = torch.vnpu.LongStorage([1, 2, 3])
    assert t.device.type == "vnpu" and t.tolist() == [1, 2, 3]
    x = torch.tensor([], dtype=torch.float64, device="vnpu").set_(s)
    assert torch.equal(x.cpu(), torch.full((5,), 2.5, dtype=torch.float64))


def test_from_buffer_is_refused_as_for_cuda():
    with pytest.raises(RuntimeError, match="vnpu"):
        torch.vnpu.FloatStorage.from_buffer(b"\0" * 8)


def test_legacy_classes_round_trip_through_save(tmp_path):
    # torch.save records a storage by its legacy type name; loading maps it back (also onto the CPU).
    x = torch.arange(6, dtype=torch.int32, device="vnpu")
    torch.save(x, tmp_path / "x.pt")
    y = torch.load(tmp_path / "x.pt")
    assert y.device.type == "vnpu" and y.storage_type() is torch.vnpu.IntStorage
    assert torch.load(tmp_path / "x.pt", map_location="cpu").storage_type() is torch.IntStorage
