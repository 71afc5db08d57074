"""The CUDA-to-vnpu mapping behind ``torch_vnpu.port.cuda`` (enable/disable).

What it changes, process-wide, until :func:`disable`:

* device arguments: a ``TorchFunctionMode`` (the mechanism of ``torch.set_default_device``) rewrites
  ``device="cuda[:i]"`` / ``torch.device("cuda", i)`` arguments of every torch function and method, and the
  positional device of ``Tensor.to``, into ``vnpu[:i]``. It is pushed in the thread that enables port mode
  (torch function modes are per thread, like ``set_default_device``);
* ``Tensor.cuda()`` / ``Module.cuda()`` / ``UntypedStorage.cuda()`` (any thread); ``torch.load`` of a checkpoint
  saved on CUDA (storages tagged ``"cuda:i"``) restores them on ``vnpu:i`` with any ``map_location`` (none, a
  string, a device, a dict, a callable), ``weights_only``, ``mmap`` and the legacy format (Note [CUDA
  checkpoints in port mode]); ``torch.set_default_device("cuda")``;
* ``torch.autocast("cuda")``, ``torch.amp.autocast("cuda")``, ``torch.cuda.amp.autocast()`` autocast vnpu;
  ``torch.amp.GradScaler("cuda")`` and ``torch.cuda.amp.GradScaler()`` are vnpu GradScalers;
* ``torch.cuda.<name>`` functions and classes that ``torch.vnpu`` also has (is_available, device_count,
  synchronize, memory_*, manual_seed*, is_bf16_supported, Stream, Event, stream, device, ...) answer for vnpu
  when called from the script's code. Calls from torch itself and from the libraries that have their own
  vnpu adapter (accelerate, transformers, peft, trl, diffusers, lightning) still see the real ``torch.cuda``:
  torch's internals then keep using real CUDA where they check it, and the libraries pick vnpu through
  ``torch_vnpu.integrations`` instead of taking their CUDA code paths. ``torch.cuda.memory``'s functions
  likewise, with the memory history API (``_record_memory_history``, ``_snapshot``, ``_dump_snapshot``);
* ``torch.distributed``: the backend ``"nccl"`` (alone, or as ``"cuda:nccl"`` in ``"cpu:gloo,cuda:nccl"``) means
  vccl on vnpu, in ``init_process_group``, ``new_group`` and every other call that takes a backend string;
  ``torch.distributed.is_nccl_available()`` is True for the script's calls; ``dist.get_backend()`` then reports
  ``"vccl"``; ``init_device_mesh("cuda", ...)`` / ``DeviceMesh("cuda", ...)`` build a vnpu mesh; ``init_process_group(...,
  device_id=torch.device("cuda", i))`` binds ``vnpu:i``;
* CUDA-only features with a vnpu equivalent (``torch_vnpu.port._cuda_only``): ``torch.Generator(device="cuda")``,
  ``x.type(torch.cuda.FloatTensor)`` and the typed tensor classes, ``torch.cuda.CUDAGraph`` / ``graph`` /
  ``make_graphed_callables``, ``torch.cuda.nvtx`` ranges (as profiler ranges);
* ``torch.profiler.profile(activities=[..., ProfilerActivity.CUDA])`` records vnpu's device activity
  (``PrivateUse1``), as CUDA's would be;

Child processes (multiprocessing spawn, ``torch.multiprocessing.spawn``) run in port mode too: ``enable`` sets
``TORCH_VNPU_PORT_MODE=1`` in the environment, and torch_vnpu enables port mode when a process with it imports torch.

Tensors report ``device.type == "vnpu"`` (and ``is_cuda`` False): a script comparing a tensor's device with
the string ``"cuda"`` sees False; its own device strings and ``torch.device("cuda")`` objects stay what they are
(``torch.device("cuda").type == "cuda"``), and work wherever torch is given them.
"""

from __future__ import annotations

import functools
import sys

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["enable", "disable", "is_enabled", "map_device", "map_backend"]

_TARGET = "vnpu"
_BACKEND = "vccl"

# Callers (module __name__ prefixes) that see the real torch.cuda.
_REAL_CUDA_CALLERS = (
    "torch.",
    "torch_vnpu",
    "accelerate",
    "transformers",
    "peft",
    "trl",
    "diffusers",
    "lightning",
    "pytorch_lightning",
    "lightning_fabric",
    "safetensors",
)

# torch.cuda names forwarded to torch.vnpu (when torch.vnpu has them).
_FORWARDED = (
    "is_available", "is_initialized", "init", "device_count", "current_device", "set_device", "synchronize",
    "get_device_name", "get_device_properties", "get_device_capability", "is_bf16_supported",
    "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state", "set_rng_state",
    "get_rng_state_all", "set_rng_state_all", "empty_cache", "memory_allocated", "max_memory_allocated",
    "memory_reserved", "max_memory_reserved", "memory_stats", "memory_summary", "memory_snapshot",
    "reset_peak_memory_stats", "reset_max_memory_allocated", "reset_accumulated_memory_stats", "mem_get_info",
    "current_stream", "default_stream", "set_stream", "stream", "ipc_collect", "set_sync_debug_mode",
    "get_sync_debug_mode", "set_per_process_memory_fraction", "get_per_process_memory_fraction",
    "host_memory_stats", "host_memory_stats_as_nested_dict", "reset_accumulated_host_memory_stats",
    "reset_peak_host_memory_stats", "memory_stats_as_nested_dict", "caching_allocator_alloc",
    "caching_allocator_delete", "can_device_access_peer", "device_memory_used", "get_allocator_backend",
    "list_gpu_processes", "memory_cached", "max_memory_cached", "reset_max_memory_cached", "use_mem_pool",
    "utilization", "memory_usage", "get_stream_from_external", "caching_allocator_enable", "change_current_allocator",
)
_CLASSES = ("Stream", "Event", "StreamContext", "device", "device_of", "MemPool", "ExternalStream")
# torch.cuda.memory names forwarded to torch.vnpu.memory: the public ones above (torch.cuda re-exports them from
# torch.cuda.memory, a script may call either) and the memory-history API CUDA users reach for.
_MEMORY_FORWARDED = _FORWARDED + ("_record_memory_history", "_snapshot", "_dump_snapshot")


def _map_activities(activities):
    """torch.profiler activities with ``ProfilerActivity.CUDA`` (bare or as a filter dict's key) replaced by
    ``PrivateUse1`` (vnpu's), unless PrivateUse1 is already there; None stays None (torch's default: all
    supported activities, vnpu's included)."""
    if activities is None:
        return None
    from torch.profiler import ProfilerActivity

    items = list(activities)
    has_device = any(a is ProfilerActivity.PrivateUse1 or (isinstance(a, dict) and ProfilerActivity.PrivateUse1 in a)
                     for a in items)
    mapped = []
    for a in items:
        if a is ProfilerActivity.CUDA:
            if not has_device:
                mapped.append(ProfilerActivity.PrivateUse1)
                has_device = True
        elif isinstance(a, dict) and ProfilerActivity.CUDA in a:
            d = {k: v for k, v in a.items() if k is not ProfilerActivity.CUDA}
            if not has_device:
                d[ProfilerActivity.PrivateUse1] = a[ProfilerActivity.CUDA]
                has_device = True
            mapped.append(d)
        else:
            mapped.append(a)
    return mapped

_saved: list[tuple[object, str, object]] = []
_mode: _CudaToVnpu | None = None


def map_device(device):
    """``"cuda"``, ``"cuda:i"``, ``torch.device("cuda"[, i])`` -> the same on vnpu; anything else unchanged."""
    if isinstance(device, str):
        if device == "cuda" or device.startswith("cuda:"):
            return _TARGET + device[4:]
    elif isinstance(device, torch.device) and device.type == "cuda":
        return torch.device(_TARGET, device.index)
    return device


def map_backend(backend):
    """A process-group backend string of CUDA -> vnpu's: ``"nccl"`` -> ``"vccl"``, ``"cuda:nccl"`` ->
    ``"vnpu:vccl"`` (also inside ``"cpu:gloo,cuda:nccl"``); anything else unchanged."""
    if not isinstance(backend, str):
        return backend
    if backend.lower() == "nccl":
        return _BACKEND
    if ":" not in backend:
        return backend
    pairs = []
    for pair in backend.split(","):
        device, _, name = pair.partition(":")
        if device.strip().lower() == "cuda":
            device = _TARGET
            name = _BACKEND if name.strip().lower() == "nccl" else name
        pairs.append(f"{device}:{name}")
    return ",".join(pairs)


class _CudaToVnpu(TorchFunctionMode):
    """Rewrites CUDA device arguments of torch functions and tensor methods to vnpu."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs:
            device = kwargs.get("device")
            if device is not None:
                mapped = map_device(device)
                if mapped is not device:
                    kwargs = dict(kwargs, device=mapped)
        if func is torch.Tensor.to and len(args) > 1:
            args = (args[0], map_device(args[1]), *args[2:])
        elif func is torch.Tensor.type and (len(args) > 1 or (kwargs and "dtype" in kwargs)):
            from ._cuda_only import typed_tensor_dtype

            kwargs = dict(kwargs or {})
            target = args[1] if len(args) > 1 else kwargs.pop("dtype")
            dtype = typed_tensor_dtype(target)
            if dtype is not None:  # x.type(torch.cuda.FloatTensor): CUDA's typed class -> vnpu, that dtype
                return args[0].to(torch.device(_TARGET, torch.vnpu.current_device()), dtype, *args[2:], **kwargs)
            return func(args[0], target, *args[2:], **kwargs)
        return func(*args, **(kwargs or {}))


def _save(owner: object, name: str, value: object) -> None:
    from ..patches import replace

    _saved.append((owner, name, getattr(owner, name)))
    replace(owner, name, value, "port-mode")


def _forwarder(real, fake):
    @functools.wraps(fake)
    def forwarded(*args, **kwargs):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith(_REAL_CUDA_CALLERS):
            return real(*args, **kwargs)
        return fake(*args, **kwargs)

    return forwarded


def _cuda_index(device) -> torch.device:
    if device is None:
        return torch.device(_TARGET, torch.vnpu.current_device())
    if isinstance(device, int):
        return torch.device(_TARGET, device)
    return torch.device(map_device(device))


# Note [CUDA checkpoints in port mode]
# torch.load restores each storage through torch.serialization's package registry: the deserializer of the
# storage's location tag ("cuda:1"), after map_location rewrote it (a dict, a string, a device, or a callable
# that returned None). CUDA's deserializer (priority 20) checks the real torch.cuda and raises here. Port mode
# registers one more deserializer ahead of it that restores "cuda[:i]" onto "vnpu[:i]" through vnpu's own
# (index check included), so every map_location form, weights_only, mmap=True and the legacy format load a
# GPU checkpoint as they would onto CUDA. It tags nothing (saving is unchanged) and is removed by disable().
_DESERIALIZER_PRIORITY = 19  # before CUDA's (20); priorities must differ (the registry sorts tuples)


def _deserialize_cuda(storage, location: str):
    if location == "cuda" or location.startswith("cuda:"):
        import torch.serialization as serialization

        return serialization.default_restore_location(storage, _TARGET + location[4:])
    return None


def _vnpu_location(location) -> str | None:
    """The vnpu location tag a port-mode save writes for a CUDA location name ("cuda:1" -> "vnpu:1")."""
    if isinstance(location, str) and (location == "cuda" or location.startswith("cuda:")):
        return _TARGET + location[4:]
    return None


def _tag_nothing(storage):
    return None


def _register_cuda_deserializer() -> None:
    import torch.serialization as serialization

    entry = (_DESERIALIZER_PRIORITY, _tag_nothing, _deserialize_cuda)
    if entry not in serialization._package_registry:
        serialization.register_package(*entry)
        from ..patches import record

        record("port-mode", "torch.serialization._package_registry (cuda -> vnpu deserializer)")


def _unregister_cuda_deserializer() -> None:
    import torch.serialization as serialization

    entry = (_DESERIALIZER_PRIORITY, _tag_nothing, _deserialize_cuda)
    while entry in serialization._package_registry:
        serialization._package_registry.remove(entry)


def enable() -> torch.device:
    """Switch port mode on (idempotent). Returns ``torch.device("vnpu")``.

    Raises:
        RuntimeError: vnpu is not available (``torch.vnpu.is_available()`` is False, e.g. VNPU_DEVICE_COUNT=0 or
            VNPU_VISIBLE_DEVICES lists no device): port mode never lets a CUDA script run on the CPU.
    """
    global _mode
    vnpu = getattr(torch, _TARGET, None)
    if vnpu is None or not vnpu.is_available():
        raise RuntimeError(
            "torch_vnpu port mode: no vnpu device is available (torch.vnpu.is_available() is False; check "
            "VNPU_DEVICE_COUNT / VNPU_VISIBLE_DEVICES, and that TORCH_DEVICE_BACKEND_AUTOLOAD is not 0 with "
            "torch_vnpu not imported). Refusing to run a CUDA script: it would silently run on the CPU."
        )
    if _mode is not None:
        return torch.device(_TARGET)
    import torch.amp.autocast_mode as autocast_mode
    import torch.amp.grad_scaler as grad_scaler

    cuda = torch.cuda
    for name in _FORWARDED:
        if hasattr(vnpu, name) and hasattr(cuda, name):
            _save(cuda, name, _forwarder(getattr(cuda, name), getattr(vnpu, name)))
    for name in _CLASSES:
        if hasattr(vnpu, name) and hasattr(cuda, name):
            _save(cuda, name, getattr(vnpu, name))
    import torch.cuda.amp as cuda_amp

    for name in ("custom_fwd", "custom_bwd"):  # torch.cuda.amp.custom_fwd -> torch.vnpu.amp's
        _save(cuda_amp, name, _forwarder(getattr(cuda_amp, name), getattr(vnpu.amp, name)))
    import torch.cuda.memory as cuda_memory

    for name in _MEMORY_FORWARDED:
        if hasattr(vnpu.memory, name) and hasattr(cuda_memory, name):
            _save(cuda_memory, name, _forwarder(getattr(cuda_memory, name), getattr(vnpu.memory, name)))
    # CUDAPluggableAllocator(so, alloc, free): the library's functions take a vnpuStream_t where CUDA's take a
    # cudaStream_t (both opaque pointers).
    _save(cuda_memory, "CUDAPluggableAllocator", vnpu.memory.VNPUPluggableAllocator)

    # torch.profiler with ProfilerActivity.CUDA records vnpu's device activity (PrivateUse1) instead.
    import torch.profiler.profiler as profiler

    kineto_init = profiler._KinetoProfile.__init__

    @functools.wraps(kineto_init)
    def kineto_profile___init__(self, *args, activities=None, **kwargs):
        kineto_init(self, *args, activities=_map_activities(activities), **kwargs)

    _save(profiler._KinetoProfile, "__init__", kineto_profile___init__)

    autocast_init = autocast_mode.autocast.__init__

    @functools.wraps(autocast_init)
    def autocast___init__(self, device_type, *args, **kwargs):
        autocast_init(self, _TARGET if device_type == "cuda" else device_type, *args, **kwargs)

    _save(autocast_mode.autocast, "__init__", autocast___init__)

    scaler_init = grad_scaler.GradScaler.__init__

    @functools.wraps(scaler_init)
    def grad_scaler___init__(self, device="cuda", *args, **kwargs):
        scaler_init(self, _TARGET if device == "cuda" else device, *args, **kwargs)

    _save(grad_scaler.GradScaler, "__init__", grad_scaler___init__)

    def tensor_cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
        """``Tensor.cuda()`` in port mode: ``Tensor.to(vnpu[:i])``."""
        return self.to(_cuda_index(device), non_blocking=non_blocking, memory_format=memory_format)

    _save(torch.Tensor, "cuda", tensor_cuda)

    def storage_cuda(self, device=None, non_blocking=False):
        """``UntypedStorage.cuda()`` in port mode (``map_location=lambda s, loc: s.cuda()``): a vnpu copy."""
        target = torch.device(_TARGET, device) if device else torch.device(_TARGET)  # torch's own rule
        return self.to(device=target, non_blocking=non_blocking)

    _save(torch.storage._StorageBase, "cuda", storage_cuda)  # TypedStorage.cuda calls it
    _register_cuda_deserializer()

    load = torch.load

    @functools.wraps(load)
    def port_load(*args, map_location=None, **kwargs):
        # Storages: the registered deserializer maps any form. A device string also reaches safetensors'
        # load_file (torch.load of a .safetensors path), which would ask the real CUDA.
        # A dict names the script's devices ("cuda:0"); a checkpoint the script saved in port mode tags its
        # storages "vnpu:0": the same entry applies to both (the value is a "cuda" name mapped on restore).
        if isinstance(map_location, dict):
            map_location = {**{_vnpu_location(k): v for k, v in map_location.items() if _vnpu_location(k)},
                            **map_location}
        return load(*args, map_location=map_location if callable(map_location) or isinstance(map_location, dict)
                    else map_device(map_location), **kwargs)

    _save(torch, "load", port_load)

    set_default_device = torch.set_default_device

    @functools.wraps(set_default_device)
    def port_set_default_device(device):
        set_default_device(map_device(device))

    _save(torch, "set_default_device", port_set_default_device)

    # init_process_group("nccl") / new_group(backend="cpu:gloo,cuda:nccl"): every backend string reaches
    # torch.distributed through Backend(...), so the mapping there covers each entry point and each import form.
    import torch.distributed as dist

    if dist.is_available():
        backend_new = dist.Backend.__new__

        def port_backend_new(cls, name):
            return backend_new(cls, map_backend(name))

        _save(dist.Backend, "__new__", port_backend_new)
        # `backend = "nccl" if dist.is_nccl_available() else "gloo"`: the script means "the GPU's backend".
        _save(dist, "is_nccl_available", _forwarder(dist.is_nccl_available, lambda: True))
        # ... also imported by name from distributed_c10d, whose own calls (ProcessGroupNCCL checks) stay real.
        from torch.distributed import distributed_c10d as c10d

        _save(c10d, "is_nccl_available", dist.is_nccl_available)
        # is_backend_available("nccl") / ("cpu:gloo,cuda:nccl"): the backend the script names, mapped.
        is_backend_available = dist.is_backend_available
        port_is_backend_available = _forwarder(is_backend_available,
                                               lambda backend: is_backend_available(map_backend(backend)))
        _save(dist, "is_backend_available", port_is_backend_available)
        _save(c10d, "is_backend_available", port_is_backend_available)
        # init_process_group(..., device_id=torch.device(f"cuda:{local_rank}")): the eager-init idiom.
        init_pg = c10d.init_process_group

        @functools.wraps(init_pg)
        def port_init_process_group(*args, device_id=None, **kwargs):
            return init_pg(*args, device_id=map_device(device_id), **kwargs)

        _save(dist, "init_process_group", port_init_process_group)
        _save(c10d, "init_process_group", port_init_process_group)
        # init_device_mesh("cuda", ...), DeviceMesh("cuda", ...), DeviceMesh.from_group(..., "cuda") all construct
        # through DeviceMesh.__init__.
        from torch.distributed.device_mesh import DeviceMesh

        mesh_init = DeviceMesh.__init__

        @functools.wraps(mesh_init)
        def device_mesh___init__(self, device_type, *args, **kwargs):
            mesh_init(self, map_device(device_type), *args, **kwargs)

        _save(DeviceMesh, "__init__", device_mesh___init__)

    from . import _cuda_only

    _cuda_only.install(_save, map_device)  # Generator("cuda"), typed tensor classes, CUDA graphs, nvtx

    _mode = _CudaToVnpu()
    _mode.__enter__()
    import os

    # Child processes started from here (multiprocessing spawn, mp.spawn) enable port mode when they import torch.
    os.environ["TORCH_VNPU_PORT_MODE"] = "1"
    return torch.device(_TARGET)


def disable() -> None:
    """Undo :func:`enable` (call it from the thread that enabled port mode)."""
    import os

    os.environ.pop("TORCH_VNPU_PORT_MODE", None)
    global _mode
    if _mode is not None:
        _mode.__exit__(None, None, None)
        _mode = None
    _unregister_cuda_deserializer()
    while _saved:
        owner, name, original = _saved.pop()
        setattr(owner, name, original)


def is_enabled() -> bool:
    return _mode is not None
