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
