"""src/torch_vnpu/testing/hf_device_spec.py: each entry works on vnpu, and transformers/diffusers load it."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from torch_vnpu.testing import hf_device_spec as spec


def test_spec_functions_act_on_vnpu():
    assert spec.DEVICE_NAME == "vnpu" and torch.device(spec.DEVICE_NAME).type == "vnpu"
    assert spec.DEVICE_COUNT_FN() == torch.vnpu.device_count() >= 1
    assert spec.SUPPORTS_TRAINING is True

    spec.MANUAL_SEED_FN(1234)
    a = torch.randn(16, device="vnpu").cpu()
    spec.MANUAL_SEED_FN(1234)
    b = torch.randn(16, device="vnpu").cpu()
    spec.MANUAL_SEED_FN(4321)
    c = torch.randn(16, device="vnpu").cpu()
    assert torch.equal(a, b) and not torch.equal(a, c)

    spec.SYNCHRONIZE_FN()
    spec.EMPTY_CACHE_FN()
    base = spec.MEMORY_ALLOCATED_FN()
    spec.RESET_PEAK_MEMORY_STATS_FN()
    spec.RESET_MAX_MEMORY_ALLOCATED_FN()
    x = torch.empty(16 << 20, dtype=torch.uint8, device="vnpu")  # large: a segment of its own
    assert spec.MEMORY_ALLOCATED_FN() >= base + (16 << 20)
    assert spec.MAX_MEMORY_ALLOCATED_FN() >= base + (16 << 20)
    reserved = torch.vnpu.memory_reserved()
    del x
    spec.SYNCHRONIZE_FN()
    spec.RESET_PEAK_MEMORY_STATS_FN()
    assert spec.MAX_MEMORY_ALLOCATED_FN() == spec.MEMORY_ALLOCATED_FN() == base
    spec.EMPTY_CACHE_FN()
    assert torch.vnpu.memory_reserved() < reserved


def test_transformers_and_diffusers_load_the_spec(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("diffusers")
    # Both libraries import the spec as importlib.import_module(<path without .py>): a bare name in the cwd.
    (tmp_path / "vnpu_spec.py").symlink_to(spec.__file__)
    probe = textwrap.dedent(
        """
        import sys
        sys.path.insert(0, "")
        import torch
        import transformers.testing_utils as tu
        import diffusers.utils.testing_utils as du
        assert tu.torch_device == "vnpu" and du.torch_device == "vnpu", (tu.torch_device, du.torch_device)
        assert tu.backend_device_count("vnpu") == torch.vnpu.device_count()
        tu.backend_manual_seed("vnpu", 7); a = torch.randn(4, device="vnpu").cpu()
        du.BACKEND_MANUAL_SEED["vnpu"](7); b = torch.randn(4, device="vnpu").cpu()
        assert torch.equal(a, b)
        tu.backend_empty_cache("vnpu")
        assert du.BACKEND_SUPPORTS_TRAINING["vnpu"] is True
        assert du.BACKEND_MAX_MEMORY_ALLOCATED["vnpu"] is torch.vnpu.max_memory_allocated
        print("spec-ok")
        """
    )
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_TEST_DEVICE="vnpu",
        TRANSFORMERS_TEST_DEVICE_SPEC="vnpu_spec.py",
        DIFFUSERS_TEST_DEVICE="vnpu",
        DIFFUSERS_TEST_DEVICE_SPEC="vnpu_spec.py",
    )
    r = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "spec-ok" in r.stdout, r.stdout + r.stderr
