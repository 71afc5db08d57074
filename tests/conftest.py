"""Shared fixtures: every test starts on device 0 with no pending device work."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch


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
