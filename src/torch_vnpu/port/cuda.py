"""``import torch_vnpu.port.cuda``: run the rest of a CUDA script on vnpu, unedited.

Importing this module switches port mode on (``torch_vnpu.port._cuda.enable``): ``"cuda"`` devices, ``.cuda()``,
``torch.cuda.*``, CUDA autocast and GradScaler map to vnpu. Raises ``RuntimeError`` when vnpu is not available
(it never lets the script fall back to the CPU). What maps and what does not: docs/porting.md.
"""

from ._cuda import disable, enable, is_enabled, map_device  # noqa: F401

device = enable()
