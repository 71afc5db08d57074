"""``torch.compile(model, backend="vnpu")``: an alias of the Inductor backend.

Registered through the ``torch_dynamo_backends`` entry point group
(pyproject.toml), as other device backends register theirs; Dynamo loads it
on first use of the name. ``mode`` and ``options`` mean what they mean for
``backend="inductor"``.
"""

from __future__ import annotations

from typing import Any


def vnpu(gm, example_inputs, mode: str | None = None, options: dict[str, Any] | None = None):
    """Compiles ``gm`` with Inductor (``torch.compile``'s default backend) for vnpu tensors."""
    import torch

    return torch._TorchCompileInductorWrapper(mode, options, dynamic=None)(gm, example_inputs)
