"""Shared fixtures: every test starts on device 0 with no pending device work."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "slow: long end-to-end cases left out of `make test` (which must stay under 30 min on 2 cores); "
        "`make test-slow` runs them")


@pytest.fixture(autouse=True)
def _clean_device():
    torch.vnpu.set_device(0)
    yield
    torch.vnpu.synchronize(0)
    torch.vnpu.set_device(0)


@pytest.fixture
def adapter():
    """torch_vnpu's opt-in Hugging Face adapter enabled, with accelerate's process-wide state reset before and
    after (imported here, lazily, so tests without accelerate do not pay for it)."""
    from accelerate.state import AcceleratorState
    import torch_vnpu.integrations.huggingface as hf_vnpu

    AcceleratorState._reset_state(reset_partial_state=True)
    with hf_vnpu.enabled():
        yield
    AcceleratorState._reset_state(reset_partial_state=True)


# Distributed tests share one 2-process and one 4-process world per session (torch_vnpu.testing.distributed):
# starting processes costs seconds on the CI machine's 2 cores, and DTensor's first use several more.
@pytest.fixture(scope="session")
def world2():
    """2 ranks, init_process_group() with no backend named (cpu:gloo,vnpu:vccl); vccl on shared memory."""
    from torch_vnpu.testing.distributed import ProcessWorld

    with ProcessWorld(2) as w:
        yield w


@pytest.fixture(scope="session")
def world2_gloo():
    """2 ranks as world2, but vccl forced onto its Gloo transport (VNPU_VCCL_TRANSPORT=gloo)."""
    from torch_vnpu.testing.distributed import ProcessWorld

    with ProcessWorld(2, env={"VNPU_VCCL_TRANSPORT": "gloo"}) as w:
        yield w


@pytest.fixture(scope="session")
def world4():
    """4 ranks (VNPU_DEVICE_COUNT=4), init_process_group("cpu:gloo,vnpu:vccl", device_id=vnpu:<rank>)."""
    from torch_vnpu.testing.distributed import ProcessWorld

    with ProcessWorld(4, env={"VNPU_DEVICE_COUNT": "4"}, init_kwargs={"backend": "cpu:gloo,vnpu:vccl"},
                      bind_device=True) as w:
        yield w
