"""torch_vnpu: the virtual NPU ("vnpu") as a native PyTorch device.

Importing this package (which ``import torch`` does on its own through the
``torch.backends`` entry point; ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` disables
that) renames PyTorch's PrivateUse1 backend to ``vnpu``, loads the native
extension (runtime, allocator, executor, generator, autocast) and installs the
``torch.vnpu`` device module, which mirrors ``torch.cuda``.
"""


def _autoload() -> None:
    """Entry point of the ``torch.backends`` group: the import registered everything."""


# Defined before ``import torch``: when ``import torch_vnpu`` comes first, torch's backend autoload
# looks up ``torch_vnpu._autoload`` on this partially initialised module.
import torch  # noqa: E402

__all__ = ["vnpu"]

_BACKEND = "vnpu"


def _check_torch_version() -> None:
    """Refuse a torch other than the one _C was compiled against (its C++ ABI differs: the extension would
    fail with an undefined symbol or worse)."""
    try:
        from ._build_info import TORCH_VERSION
    except ImportError:  # not generated (a source tree): nothing to compare
        return
    if torch.__version__.split("+")[0] != TORCH_VERSION.split("+")[0]:
        raise ImportError(
            f"torch_vnpu was built for torch {TORCH_VERSION}, but torch {torch.__version__} is loaded "
            f"(from {torch.__file__}). Install torch=={TORCH_VERSION.split('+')[0]} or rebuild torch_vnpu against "
            "this torch (`pip install --no-build-isolation --no-deps .`); TORCH_DEVICE_BACKEND_AUTOLOAD=0 keeps "
            "`import torch` from loading it."
        )


def _register() -> None:
    if torch._C._get_privateuse1_backend_name() != _BACKEND:
        torch.utils.rename_privateuse1_backend(_BACKEND)
    _check_torch_version()
    try:
        from . import _C  # noqa: F401  (registers kernels, hooks, allocators)
    except ImportError as e:
        raise ImportError(
            f"torch_vnpu was imported from {__path__[0]}, which has no compiled extension (_C): install the "
            "package (`make install` or `pip install --no-build-isolation .`) and import it from there, or set "
            "TORCH_DEVICE_BACKEND_AUTOLOAD=0."
        ) from e
    from . import vnpu

    if not hasattr(torch, _BACKEND):
        torch._register_device_module(_BACKEND, vnpu)
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
        )
    vnpu._install_at_exit()
    # Every change to PyTorch's own behaviour is declared in src/torch_vnpu/patches/registry.py.
    from .patches import (cpu_policies, cuda_unavailable, dcp_read, dcp_staging, host_modes, load_streamed,
                          optim_capture, profiler_export, profiler_stop, save_batched)

    cpu_policies.register(_BACKEND)
    host_modes.install()  # global modes take effect as of the call, however far behind the streams are
    optim_capture.install(_BACKEND)  # capturing step() of a capturable=False optimizer raises, as on CUDA
    from ._inductor import lazy

    lazy.install()  # torch.compile support, registered on first use (no Dynamo/Inductor import here)
    from . import distributed

    distributed._register()
    # Not "multiprocessing.py": Python started inside src/torch_vnpu/ would import it as the stdlib's.
    from . import _multiprocessing_reductions

    _multiprocessing_reductions._register()  # vnpu tensors through torch.multiprocessing queues (device memory IPC)
    profiler_export.install()  # a failed trace export raises OSError and keeps the trace
    profiler_stop.install()  # a device error at the profiler's stop keeps the trace
    cuda_unavailable.install()  # "Torch not compiled with CUDA enabled" names port mode
    load_streamed.install()  # torch.load(path, map_location="vnpu") reads the file into device memory
    dcp_read.install()  # torch.distributed.checkpoint.load reads vnpu tensors from the files into the device
    dcp_staging.install()  # dcp.save waits for the staging copies of tensors on every vnpu device
    save_batched.install()  # torch.save downloads vnpu storages ahead into pinned buffers
    from .integrations import _autoload

    _autoload.install()  # library adapters switch on when their library is imported (VNPU_INTEGRATIONS)
    import os

    # Imported only when asked for. The runtime's rule for boolean variables: "1" on; any other value keeps the
    # default (off), and the runtime warns about it at the device's first use.
    if os.environ.get("VNPU_SANITIZE") == "1":
        from . import sanitizer

        sanitizer._enable_from_environment()
    # A child of a port-mode process (multiprocessing spawn, mp.spawn of the DDP tutorial) runs the same CUDA
    # code: port mode passes to it through the environment (torch_vnpu.port._cuda.enable sets the variable).
    if os.environ.get("TORCH_VNPU_PORT_MODE") == "1":
        from .port import _cuda as _port

        _port.enable()


_register()
