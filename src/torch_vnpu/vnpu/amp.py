"""Automatic mixed precision on vnpu (mirrors ``torch.cuda.amp``).

``torch.autocast("vnpu", dtype=torch.bfloat16 | torch.float16)`` applies CUDA's
cast policies; ``torch.amp.GradScaler("vnpu")`` scales fp16 losses.
"""

import torch


class autocast(torch.amp.autocast_mode.autocast):
    """``torch.vnpu.amp.autocast(dtype=torch.float16)`` == ``torch.autocast("vnpu", dtype=...)``."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True):
        super().__init__("vnpu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


def GradScaler(*args, **kwargs) -> torch.amp.GradScaler:
    """Shorthand for ``torch.amp.GradScaler("vnpu", ...)``."""
    return torch.amp.GradScaler("vnpu", *args, **kwargs)


def custom_fwd(fwd=None, *, cast_inputs=None):
    """``torch.amp.custom_fwd(device_type="vnpu")``: the decorator for a custom autograd Function's ``forward``
    under vnpu autocast, as ``torch.cuda.amp.custom_fwd`` is for CUDA (see ``torch.amp.custom_fwd``)."""
    return torch.amp.custom_fwd(fwd, device_type="vnpu", cast_inputs=cast_inputs)


def custom_bwd(bwd=None):
    """``torch.amp.custom_bwd(device_type="vnpu")``: runs ``backward`` with the forward's autocast state, as
    ``torch.cuda.amp.custom_bwd``."""
    return torch.amp.custom_bwd(bwd, device_type="vnpu")
