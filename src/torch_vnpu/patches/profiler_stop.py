"""A device error at the profiler's stop keeps the trace.

Leaving ``torch.profiler.profile`` (torch 2.13's ``torch.autograd.profiler.profile.__exit__``) synchronizes the
device before it stops the profiler. When that synchronize raises (a kernel error still queued at the end of the
region, or Ctrl-C while waiting), the profiler is never stopped: the trace is lost, the profiler stays on and the
process crashes at exit. On CUDA such an error leaves the context unusable anyway; a vnpu device recovers from
it, so the trace of the failing step is what the user wants. Here the profiler is stopped first (its Kineto
plug-in still collects every task recorded so far, the failed one marked), then the error is raised.
"""

from __future__ import annotations

import functools

from . import replace


def install() -> None:
    import torch
    import torch.autograd.profiler as autograd_profiler

    owner = autograd_profiler.profile
    exit_ = owner.__exit__
    if getattr(exit_, "_vnpu_keeps_trace", False):
        return
    backend = torch._C._get_privateuse1_backend_name()

    @functools.wraps(exit_)
    def __exit__(self, exc_type, exc_val, exc_tb):
        if not self.enabled or self.use_device != backend:
            return exit_(self, exc_type, exc_val, exc_tb)
        try:
            getattr(torch, backend).synchronize()
        except BaseException:
            use_device, self.use_device = self.use_device, None  # stop without synchronizing again
            try:
                exit_(self, exc_type, exc_val, exc_tb)
            finally:
                self.use_device = use_device
            raise
        return exit_(self, exc_type, exc_val, exc_tb)  # its own synchronize returns at once

    __exit__._vnpu_keeps_trace = True
    replace(owner, "__exit__", __exit__, "profiler.stop-keeps-trace")
