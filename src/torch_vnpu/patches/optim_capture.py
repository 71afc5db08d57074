"""torch.optim's graph-capture health check, extended to vnpu.

An optimizer built with ``capturable=False`` (the default) keeps its step counters as CPU tensors and computes
its bias corrections on the host, so a graph that captures its ``step()`` replays the capture step's corrections
and never advances the counters: the parameters go silently wrong. On CUDA and XPU ``Optimizer.step()`` raises
instead (``Optimizer._accelerator_graph_capture_health_check``), but torch 2.13 runs that check only for those
two device types. This module runs the same check, with the same RuntimeError, when the current accelerator is
vnpu. Upstream fix that removes this file: key the check on ``torch.accelerator`` capture support, not a type list.
"""
import functools

import torch
from torch.optim.optimizer import Optimizer

from . import replace


def install(device_type: str) -> None:
    """Wraps ``Optimizer._accelerator_graph_capture_health_check`` for ``device_type``. Idempotent."""
    original = Optimizer.__dict__["_accelerator_graph_capture_health_check"]
    if getattr(original, "_vnpu_wrapped", False):
        return

    @functools.wraps(original)
    def _accelerator_graph_capture_health_check(self: Optimizer) -> None:
        # torch's check does nothing for vnpu, and under compile Inductor decides about graphs itself.
        accelerator = torch.accelerator.current_accelerator(check_available=True)
        if accelerator is None or accelerator.type != device_type or torch.compiler.is_compiling():
            return original(self)
        if torch.accelerator.current_stream().is_capturing() and not all(
            group["capturable"] for group in self.param_groups
        ):
            raise RuntimeError(
                f"Attempting {device_type} graph capture of step() for an instance of {type(self).__name__} but "
                "param_groups' capturable is False. Construct the optimizer with capturable=True to capture its "
                "step() (its step counters then live on the device)."
            )

    _accelerator_graph_capture_health_check._vnpu_wrapped = True
    replace(Optimizer, "_accelerator_graph_capture_health_check", _accelerator_graph_capture_health_check,
            "optim.graph-capture-health-check")
