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


def _register() -> None:
    if torch._C._get_privateuse1_backend_name() != _BACKEND:
        torch.utils.rename_privateuse1_backend(_BACKEND)
    try:
        from . import _C  # noqa: F401  (registers kernels, hooks, allocators)
    except ImportError as e:
        raise ImportError(
            f"torch_vnpu was imported from {__path__[0]}, which has no compiled extension (_C). "
            "Install the package (`make install` or `pip install --no-build-isolation .`) and run "
            "Python from outside the source tree, or set TORCH_DEVICE_BACKEND_AUTOLOAD=0."
        ) from e
    from . import vnpu

    if not hasattr(torch, _BACKEND):
        torch._register_device_module(_BACKEND, vnpu)
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
        )
    vnpu._install_at_exit()
    from . import _cpu_policies

    _cpu_policies.register(_BACKEND)
    from ._inductor import lazy

    lazy.install()  # torch.compile support, registered on first use (no Dynamo/Inductor import here)
    from . import distributed

    distributed._register()
    from . import multiprocessing

    multiprocessing._register()  # vnpu tensors through torch.multiprocessing queues (device memory IPC)
    from .integrations import _autoload

    _autoload.install()  # library adapters switch on when their library is imported (VNPU_INTEGRATIONS)


_register()
