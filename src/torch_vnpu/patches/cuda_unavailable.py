"""A CUDA script run on a machine without CUDA, in a process where torch_vnpu is loaded: torch's "Torch not
compiled with CUDA enabled" (``x.cuda()``, ``torch.cuda.synchronize()``, ...) also says how to run the script on
vnpu unedited. ``Tensor.cuda()`` reaches the check from C++ through ``torch.cuda._lazy_init``, looked up at each
call, so wrapping that function covers every entry point; the exception type stays torch's (AssertionError)."""

from __future__ import annotations

import functools

import torch

from . import replace

_HINT = ("; torch_vnpu is loaded: run this CUDA script on vnpu unedited with `python -m torch_vnpu.port.run "
         "script.py` (or `import torch_vnpu.port.cuda` at its top), or use torch.accelerator / device='vnpu' "
         "(`python -m torch_vnpu.port.check script.py` lists the CUDA calls)")


def install() -> None:
    import torch.cuda

    original = torch.cuda._lazy_init
    if getattr(original, "_vnpu_hint", False):
        return

    @functools.wraps(original)
    def _lazy_init():
        try:
            original()
        except AssertionError as e:
            if "not compiled with CUDA" in str(e) and _HINT not in str(e):
                raise AssertionError(str(e) + _HINT) from None
            raise

    _lazy_init._vnpu_hint = True
    replace(torch.cuda, "_lazy_init", _lazy_init, "cuda-unavailable.hint")
