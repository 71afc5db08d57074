"""The code generator classes of vnpu, by the names Inductor's PrivateUse1 discovery uses (``torch.vnpu.<name>``)."""

from __future__ import annotations

from .cpp_wrapper import VnpuCppWrapperCodegen
from .fx_wrapper import VnpuWrapperFxCodegen
from .scheduling import VnpuScheduling
from .wrapper import VnpuPythonWrapperCodegen

CODEGEN_CLASSES = {
    "Scheduling": VnpuScheduling,
    "PythonWrapperCodegen": VnpuPythonWrapperCodegen,
    "CppWrapperCodegen": VnpuCppWrapperCodegen,
    "WrapperFxCodegen": VnpuWrapperFxCodegen,
}
