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
