"""AOTInductor packages of vnpu graphs (``torch._inductor.aoti_compile_and_package``).

The generated C++ (:mod:`.cpp_wrapper` in AOT mode) is built as AOTInductor builds
a CPU model: vnpu's fused kernels are Inductor's CPU kernels, and the model's
runtime is a CPU one (Note [AOTInductor on vnpu] in csrc/inductor/AotiRunner.cpp).
The package's ``AOTI_DEVICE_KEY`` is ``vnpu``, so ``aoti_load_package`` creates
vnpu's model runner, which copies the weights to vnpu and hands the model the
launch API.

Only packages are supported (``aoti_compile_and_package``, i.e.
``aot_inductor.package=True``): a bare ``.so`` (``torch._inductor.aot_compile``)
raises NotImplementedError, because torch 2.13's loader for it,
``torch._export.aot_load(so_path, device)``, knows the devices cpu/cuda/xpu/mps
only (no runner registry, unlike ``aoti_load_package``), and the API is deprecated
in favour of packages.
"""

from __future__ import annotations

import json

_DEVICE = "vnpu"


def _set_device_key(files) -> None:
    """Writes vnpu's device key and information into the package's metadata files."""
    from torch._inductor.codecache import get_device_information

    for path in files:
        if isinstance(path, str) and path.endswith("_metadata.json"):
            with open(path) as f:
                metadata = json.load(f)
            metadata.update(get_device_information(_DEVICE))  # what aoti_load_package compares with
            metadata["AOTI_DEVICE_KEY"] = _DEVICE
            with open(path, "w") as f:
                json.dump(metadata, f)


def apply() -> None:
    """Builds vnpu graphs' AOTInductor models as CPU code under the vnpu device key (idempotent)."""
    from torch._inductor import codecache, config

    original = codecache.AotCodeCompiler.__dict__["compile"]
    if getattr(original, "_vnpu_original", None) is not None:
        return
    compile_fn = original.__func__

    def compile(cls, graph, wrapper_code, kernel_code, serialized_extern_kernel_nodes, *, device_type, **kwargs):
        if device_type != _DEVICE:
            return compile_fn(cls, graph, wrapper_code, kernel_code, serialized_extern_kernel_nodes,
                              device_type=device_type, **kwargs)
        if not config.aot_inductor.package:
            raise NotImplementedError(
                "AOTInductor on vnpu builds packages only: use torch._inductor.aoti_compile_and_package and "
                "torch._inductor.aoti_load_package (torch._export.aot_load, the bare .so's loader, has no vnpu runner)"
            )
        try:
            files = compile_fn(cls, graph, wrapper_code, kernel_code, serialized_extern_kernel_nodes,
                               device_type="cpu", **kwargs)
        finally:
            config.aot_inductor.metadata["AOTI_DEVICE_KEY"] = _DEVICE  # not a patch: the package's metadata
        _set_device_key(files)
        return files

    compile._vnpu_original = original  # type: ignore[attr-defined]
    from ..patches import replace

    replace(codecache.AotCodeCompiler, "compile", classmethod(compile), "inductor.aoti-package")
