"""Opt-in adapter: Hugging Face accelerate, transformers and peft pick the current accelerator (vnpu);
safetensors accepts its device strings.

accelerate 1.15 (``PartialState.default_device``), transformers 5.17 (``TrainingArguments._setup_devices``,
``is_torch_bf16_gpu_available``) and peft 0.21 (``infer_device``) choose their device from hard-coded lists
(cuda, xpu, npu, mps, ...) and fall back to the CPU for any other device, even when
``torch.accelerator.current_accelerator()`` names one. :func:`enable` adds that missing last step, the
direction upstream is taking: where a library's own detection ends in ``cpu``, ask ``torch.accelerator``.
It changes nothing when the libraries already found a device (CUDA, XPU, ...), when the user asked for the
CPU (``Accelerator(cpu=True)``, ``TrainingArguments(use_cpu=True)``) or set ``ACCELERATE_TORCH_DEVICE``
(accelerate's own override, honoured as before).

Under ``torchrun`` or ``accelerate launch`` (``LOCAL_RANK`` set) accelerate knows the collectives backend of
listed devices only and otherwise trains every rank alone; with the adapter it initializes
``cpu:gloo,vnpu:vccl``, puts rank ``i`` on ``vnpu:<LOCAL_RANK mod device count>`` and wraps models with DDP,
or FSDP2 with its FSDP plugin, as for CUDA (``DistributedType.MULTI_GPU``); the ``Trainer`` follows.

Usage::

    import torch_vnpu.integrations.huggingface as hf_vnpu
    hf_vnpu.enable()                      # or: with hf_vnpu.enabled(): ...
    from accelerate import Accelerator
    Accelerator().device                  # device(type='vnpu')

or run an unchanged program with ``python -m torch_vnpu.integrations.huggingface script.py [args]`` (or
``... -m module [args]``; multi-process: ``torchrun --nproc-per-node 2 -m torch_vnpu.integrations.huggingface
script.py``, ``accelerate launch --multi_gpu --num_processes 2 -m torch_vnpu.integrations.huggingface script.py``).
What each patch does and the upstream change that would make it unnecessary: ``docs/huggingface.md``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import os
import runpy
import sys
import warnings
from typing import Iterator

import torch

__all__ = ["enable", "disable", "enabled", "is_enabled", "patched_names"]

logger = logging.getLogger("torch_vnpu.integrations")

# (owner object, attribute name, original value) for every attribute enable() replaced, in order.
_patches: list[tuple[object, str, object]] = []


def _accelerator() -> torch.device | None:
    """The current accelerator as a device without index (like ``torch.device("cuda")``), or None."""
    acc = torch.accelerator.current_accelerator(check_available=True)
    return None if acc is None else torch.device(acc.type)


# The registered patch (torch_vnpu.patches.registry) each _patch_* function applies.
_PATCH_IDS = {
    "_patch_accelerate": "huggingface.accelerate",
    "_patch_accelerate_multiprocess": "huggingface.accelerate",
    "_patch_accelerate_max_memory": "huggingface.accelerate",
    "_patch_transformers": "huggingface.transformers",
    "_patch_transformers_generation": "huggingface.transformers",
    "_patch_transformers_loading": "huggingface.transformers",
    "_patch_peft": "huggingface.peft",
    "_patch_safetensors": "huggingface.safetensors",
}


def _set(owner: object, name: str, value: object, why: str = "") -> None:
    from .. import patches

    _patches.append((owner, name, owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)))
    patches.replace(owner, name, value, _PATCH_IDS[sys._getframe(1).f_code.co_name])
    logger.debug("huggingface adapter: patched %s%s", _qualname(owner, name), f": {why}" if why else "")


def _qualname(owner: object, name: str) -> str:
    qual = getattr(owner, "__qualname__", None) or getattr(owner, "__name__", type(owner).__name__)
    module = getattr(owner, "__module__", None)
    return f"{module}.{qual}.{name}" if isinstance(owner, type) or callable(owner) else f"{qual}.{name}"


def _patch_accelerate(device_type: str) -> None:
    import accelerate.accelerator
    import accelerate.state
    import accelerate.utils
    import accelerate.utils.modeling

    # 1. Device selection: PartialState.default_device ends in cpu for any device it does not list.
    orig_default = accelerate.state.PartialState.default_device.fget

    @functools.wraps(orig_default)
    def default_device(self) -> torch.device:
        device = orig_default(self)
        if device.type == "cpu":
            acc = _accelerator()
            if acc is not None:
                return acc
        return device

    _set(accelerate.state.PartialState, "default_device", property(default_device), "1, cpu fallback -> accelerator")

    # 2. fp16 mixed precision: Accelerator.__init__ rejects any device outside an inline tuple constant
    #    ("xpu", "cuda", "npu", ...). Add the accelerator's type to that constant, nothing else.
    init = accelerate.accelerator.Accelerator.__init__
    code = init.__code__
    allow_lists = [c for c in code.co_consts if isinstance(c, tuple) and "cuda" in c and "xpu" in c and "npu" in c]
    if len(allow_lists) != 1:
        raise RuntimeError(
            f"accelerate {accelerate.__version__}: cannot find the fp16 device allow-list in Accelerator.__init__ "
            "(the adapter was written for accelerate 1.15); fp16 mixed precision would fail on "
            f"{device_type!r}. Please report this."
        )
    if device_type not in allow_lists[0]:
        consts = tuple(c + (device_type,) if c is allow_lists[0] else c for c in code.co_consts)
        _set(init, "__code__", code.replace(co_consts=consts), f"2, {device_type} in the fp16 device list")

    # 3. fp16 GradScaler: get_grad_scaler() returns a CUDA GradScaler for any device it does not list (FSDP2 does
    #    not use it: accelerate makes GradScaler(device.type) itself).
    orig_scaler = accelerate.utils.modeling.get_grad_scaler

    @functools.wraps(orig_scaler)
    def get_grad_scaler(distributed_type=None, **kwargs):
        device = accelerate.state.PartialState._shared_state.get("device")  # read only: no state is created
        if distributed_type != accelerate.utils.DistributedType.FSDP and getattr(device, "type", None) == device_type:
            return torch.amp.GradScaler(device_type, **kwargs)
        return orig_scaler(distributed_type, **kwargs)

    for module in (accelerate.utils.modeling, accelerate.utils, accelerate.accelerator):
        _set(module, "get_grad_scaler", get_grad_scaler, f"3, GradScaler({device_type!r})")

    _patch_accelerate_max_memory(device_type)
    _patch_accelerate_multiprocess(device_type)


_ALLOCATOR_SLACK = 20 << 20


def _patch_accelerate_max_memory(device_type: str) -> None:
    import accelerate.utils
    import accelerate.utils.modeling

    # 15. Big-model dispatch (from_pretrained / dispatch with device_map="auto", "balanced", "sequential"):
    #    get_max_memory measures the devices of its list (cuda, npu, xpu, ...) only, so every weight went to the
    #    CPU. When none of them is there, the accelerator's devices are measured instead, by index as CUDA's are
    #    (an int device is torch.device(i), the accelerator's device i): free memory plus what torch's caching
    #    allocator holds unused, as transformers adds for CUDA, less 20 MiB. A user's max_memory with indices is
    #    checked against the accelerator's device count instead of CUDA's.
    orig = accelerate.utils.modeling.get_max_memory
    module = torch.get_device_module(device_type)

    def accelerate_has_a_device() -> bool:  # a device of get_max_memory's own list: accelerate's business
        checks = ("is_npu_available", "is_mlu_available", "is_sdaa_available", "is_musa_available",
                  "is_xpu_available", "is_hpu_available")
        return torch.cuda.device_count() > 0 or any(getattr(accelerate.utils, c, lambda: False)() for c in checks)

    @functools.wraps(orig)
    def get_max_memory(max_memory=None):
        # (after disable(), a module that imported this function keeps it: it then defers to accelerate's own)
        if _mode == "off" or accelerate_has_a_device() or module.device_count() == 0:
            return orig(max_memory)
        if max_memory is None:
            mine = {}
            for i in range(module.device_count()):
                free, _ = module.mem_get_info(i)
                usable = free + module.memory_reserved(i) - module.memory_allocated(i)
                # Less one 20 MiB segment, the most the caching allocator (CUDA's rules) rounds a request up to:
                # a map filled to the byte would raise OutOfMemoryError instead of spilling to the CPU.
                mine[i] = max(0, usable - _ALLOCATOR_SLACK)
            return {**mine, **orig(None)}
        for key, value in max_memory.items():  # in place, as accelerate does (transformers reads the dict after)
            if isinstance(value, str):
                max_memory[key] = accelerate.utils.convert_file_size_to_int(value)
        rest = orig({k: v for k, v in max_memory.items() if not isinstance(k, int)})
        count = module.device_count()
        indices = sorted(k for k in max_memory if isinstance(k, int))
        for i in indices:
            if not 0 <= i < count:
                accelerate.utils.modeling.logger.warning(
                    f"Device {i} is not available, available devices are {list(range(count))}")
        return {**{i: max_memory[i] for i in indices}, **rest}

    for owner in (accelerate.utils.modeling, accelerate.utils):
        _set(owner, "get_max_memory", get_max_memory, f"15, {device_type} devices in big-model dispatch")
    tia = sys.modules.get("transformers.integrations.accelerate")
    if tia is not None and getattr(tia, "accelerate_max_memory", None) is orig:  # imported before: its own name
        _set(tia, "accelerate_max_memory", get_max_memory, f"15, {device_type} devices in big-model dispatch")


def _patch_accelerate_multiprocess(device_type: str) -> None:
    import accelerate.state
    from accelerate.utils import DistributedType

    state_cls = accelerate.state.PartialState

    # 8. Backend selection: under torchrun (LOCAL_RANK set) _prepare_backend knows a fixed list of devices and
    #    their backends (cuda -> nccl, xpu -> xccl, npu -> hccl, ...); for any other device it returns
    #    DistributedType.NO, so every rank trains alone on the whole data set. For the accelerator it returns
    #    MULTI_GPU, accelerate's generic "one process per device, device-side collectives" type (DDP with
    #    device_ids=[local rank], upgraded to FSDP by the FSDP plugin as for cuda), and the backend torch picks
    #    for the accelerator: "cpu:gloo,vnpu:vccl" (a backend the user named is kept).
    orig_prepare = state_cls.__dict__["_prepare_backend"]

    @functools.wraps(orig_prepare)
    def _prepare_backend(self, cpu: bool = False, sagemaker_dp=False, backend: str | None = None):
        backend_out, distributed_type = orig_prepare(self, cpu, sagemaker_dp, backend)
        if (
            distributed_type == DistributedType.NO
            and not cpu
            and not sagemaker_dp
            and int(os.environ.get("LOCAL_RANK", -1)) != -1
            and _accelerator() is not None
        ):
            return backend or f"cpu:gloo,{device_type}:vccl", DistributedType.MULTI_GPU
        return backend_out, distributed_type

    _set(state_cls, "_prepare_backend", _prepare_backend, f"8, LOCAL_RANK -> cpu:gloo,{device_type}:vccl")

    # 9. Device placement: set_device() maps MULTI_GPU to torch.cuda. For the MULTI_GPU state of patch 8
    #    (no CUDA), use the accelerator's device <local rank mod device count>, as accelerate does for cuda.
    orig_set_device = state_cls.__dict__["set_device"]

    @functools.wraps(orig_set_device)
    def set_device(self) -> None:
        if (
            self.device is None
            and self.distributed_type == DistributedType.MULTI_GPU
            and not torch.cuda.is_available()
            and _accelerator() is not None
        ):
            module = torch.get_device_module(device_type)
            self.device = torch.device(device_type, self.local_process_index % module.device_count())
            module.set_device(self.device)
            return
        orig_set_device(self)

    _set(state_cls, "set_device", set_device, f"9, MULTI_GPU -> {device_type}:<local rank>")


def _patch_transformers(device_type: str) -> None:
    import transformers.training_args as ta
    from accelerate.state import DistributedType

    # 4. TrainingArguments._setup_devices: for one process it re-detects the device from its own list and
    #    ends in os.environ.get("ACCELERATE_TORCH_DEVICE", "cpu"), ignoring the device accelerate chose.
    orig_setup = ta.TrainingArguments.__dict__["_setup_devices"]

    def _setup_devices(self) -> torch.device:
        device = orig_setup.func(self)
        state = self.distributed_state
        if (
            device.type == "cpu"
            and not self.use_cpu
            and state is not None
            and state.distributed_type == DistributedType.NO
            and state.device.type == device_type
        ):
            device = torch.device(device_type, torch.accelerator.current_device_index())
            self._n_gpu = 1  # one accelerator in this process, as for a single CUDA device (no DataParallel)
        return device

    _setup_devices.__doc__ = orig_setup.__doc__
    prop = functools.cached_property(_setup_devices)
    prop.__set_name__(ta.TrainingArguments, "_setup_devices")
    _set(ta.TrainingArguments, "_setup_devices", prop, "4, single-process device from accelerate")

    # 5. bf16: TrainingArguments(bf16=True) asks is_torch_bf16_gpu_available(), which knows listed devices only.
    orig_bf16 = ta.is_torch_bf16_gpu_available

    @functools.wraps(orig_bf16)
    def is_torch_bf16_gpu_available() -> bool:
        if orig_bf16():
            return True
        module = getattr(torch, device_type, None)
        return _accelerator() is not None and bool(getattr(module, "is_bf16_supported", lambda: False)())

    _set(ta, "is_torch_bf16_gpu_available", is_torch_bf16_gpu_available, f"5, bf16 on {device_type}")


def _patch_transformers_generation(device_type: str) -> None:
    from transformers.generation.utils import GenerationMixin

    # 10. generate() swaps MoE experts from grouped_mm to batched_mm for decoding on every non-CPU device
    #     (batched_mm copies each selected expert's weights per token: fast on GPUs, 3x slower than grouped_mm
    #     with the CPU kernels vnpu runs). On the accelerator, decode with the model's own implementation.
    orig = GenerationMixin.__dict__["_optimize_model_for_decode"]

    @functools.wraps(orig)
    @contextlib.contextmanager
    def _optimize_model_for_decode(self):
        if self.device.type == device_type:
            yield
            return
        with orig(self):
            yield

    _set(GenerationMixin, "_optimize_model_for_decode", _optimize_model_for_decode,
         f"10, MoE decode on {device_type} keeps grouped_mm")

    # 14. generate() compiles the decode step (mode="reduce-overhead": graphs) with a compilable cache only on the
    #     devices it lists (cuda, xpu, neuron, tpu); on vnpu a static-cache generate() silently stayed eager.
    #     vnpu passes the hardware check, as with CompileConfig's _compile_all_devices; every other criterion
    #     (cache type, quantizer, offload, disable_compile) is transformers' own.
    from transformers.generation.configuration_utils import CompileConfig

    orig_criteria = GenerationMixin.__dict__["_valid_auto_compile_criteria"]

    @functools.wraps(orig_criteria)
    def _valid_auto_compile_criteria(self, model_kwargs, generation_config):
        user_config = generation_config.compile_config
        if self.device.type != device_type or (user_config is not None and user_config._compile_all_devices):
            return orig_criteria(self, model_kwargs, generation_config)
        probe = copy.copy(generation_config)
        probe.compile_config = copy.copy(user_config) if user_config is not None else CompileConfig()
        probe.compile_config._compile_all_devices = True
        if user_config is not None:
            return orig_criteria(self, model_kwargs, probe)
        # Without a compile_config of the user's, transformers' "you have set compile_config" warning is not theirs.
        gen_logger = logging.getLogger("transformers.generation.utils")
        disabled, gen_logger.disabled = gen_logger.disabled, True
        try:
            return orig_criteria(self, model_kwargs, probe)
        finally:
            gen_logger.disabled = disabled

    _set(GenerationMixin, "_valid_auto_compile_criteria", _valid_auto_compile_criteria,
         f"14, generate() compiles its decode step on {device_type}")


class _TrackedSafeOpen:
    """A safetensors file handle (``safe_open``'s) whose slices remember their file and name, and the open file
    itself (torch_vnpu.checkpoints' OpenedFile, from before safetensors opened it through ``/proc/self/fd``): its
    tensors are read from the file the handle maps, not from whatever file the path names by the time they are
    read. Closed with the handle (``with``) or when collected."""

    def __init__(self, handle, filename, file):
        self._handle, self._filename, self._file = handle, os.fspath(filename), file

    def get_slice(self, name):
        return _TrackedSlice(self._handle.get_slice(name), self._filename, name, self._file)

    def __enter__(self):
        self._handle.__enter__()
        return self

    def __exit__(self, *exc):
        self._file.close()
        return self._handle.__exit__(*exc)

    def __getattr__(self, name):
        return getattr(self._handle, name)


def _open_tracked(orig_open, filename, *args, **kwargs):
    """(safetensors' handle of ``filename``, its OpenedFile): the file is opened first and safetensors maps that
    open file, so both read one file."""
    from ..checkpoints._files import OpenedFile

    file = OpenedFile(filename)
    try:
        with file.naming_errors():
            return orig_open(file.proc_path, *args, **kwargs), file
    except BaseException:
        file.close()
        raise


class _DeviceSafeOpen(_TrackedSafeOpen):
    """A safetensors file handle opened onto a vnpu device: get_tensor reads the tensor into device memory."""

    def __init__(self, handle, filename, file, device):
        super().__init__(handle, filename, file)
        self._device = device

    def get_slice(self, name):
        return self._handle.get_slice(name)

    def get_tensor(self, name):
        from ..checkpoints.safetensors import read_tensor

        out = None
        if not self._file.closed:  # (closed: safetensors' own "File is closed")
            try:
                out = read_tensor(self._filename, name, self._device, self._file)
            except KeyError:  # not in the file: safetensors' own error
                pass
        return out if out is not None else self._handle.get_tensor(name)


class _TrackedSlice:
    """safetensors' lazy slice, with the file and tensor name it reads (torch_vnpu.checkpoints reads it whole)."""

    def __init__(self, slice_, filename, name, file):
        self._slice, self.filename, self.name, self.file = slice_, filename, name, file

    def __getitem__(self, index):
        return self._slice[index]

    def __getattr__(self, name):
        return getattr(self._slice, name)


def _patch_transformers_loading(device_type: str) -> None:
    import transformers.core_model_loading as cml
    import transformers.modeling_utils as mu

    # 13. from_pretrained(device_map=<vnpu>) materializes each weight from safetensors' memory map into a CPU
    #     tensor and copies it with a blocking copy (on 4 threads). The weights are read from the file straight
    #     into device memory through pinned buffers instead (torch_vnpu.checkpoints), dtype conversion on the
    #     device. Other devices, partial slices (tensor parallel) and dtypes without a torch name keep
    #     transformers' path; transformers shows its own progress bar.
    orig_open = mu.safe_open

    @functools.wraps(orig_open, updated=())
    def safe_open(filename, *args, **kwargs):
        handle, file = _open_tracked(orig_open, filename, *args, **kwargs)
        return _TrackedSafeOpen(handle, filename, file)

    _set(mu, "safe_open", safe_open, "13, slices remember their file")
    orig_copy = cml._materialize_copy

    @functools.wraps(orig_copy)
    def _materialize_copy(tensor, device=None, dtype=None):
        if isinstance(tensor, _TrackedSlice):
            target = torch.device(device) if isinstance(device, (str, int)) and device != "disk" else device
            if isinstance(target, torch.device) and target.type == device_type:
                from ..checkpoints.safetensors import read_tensor

                out = None if tensor.file.closed else read_tensor(tensor.filename, tensor.name, target, tensor.file,
                                                                  dtype)
                if out is not None:
                    return out
            tensor = tensor._slice
        return orig_copy(tensor, device, dtype)

    _set(cml, "_materialize_copy", _materialize_copy, f"13, weights read into {device_type} memory")


def _patch_peft() -> None:
    import peft.peft_model
    import peft.utils
    import peft.utils.other

    # 6. peft.utils.infer_device(): same hard-coded list, ends in "cpu".
    orig_infer = peft.utils.other.infer_device

    @functools.wraps(orig_infer)
    def infer_device() -> str:
        device = orig_infer()
        acc = _accelerator()
        return acc.type if device == "cpu" and acc is not None else device

    for module in (peft.utils.other, peft.utils, peft.peft_model):
        _set(module, "infer_device", infer_device, "6, cpu fallback -> accelerator")


def _safetensors_device(device: object, device_type: str) -> object:
    """``"vnpu"``, ``"vnpu:1"`` or ``torch.device("vnpu", 1)`` as the device index safetensors accepts (it maps an
    int ``i`` to ``torch.device(i)``, the accelerator's device ``i``); any other device unchanged."""
    if isinstance(device, str) and device.split(":", 1)[0] == device_type:
        device = torch.device(device)
    if isinstance(device, torch.device) and device.type == device_type:
        return device.index if device.index is not None else torch.accelerator.current_device_index()
    return device


def _patch_safetensors(device_type: str) -> None:
    import importlib

    import safetensors

    # From sys.modules: when the import of safetensors.torch triggers this, the package has no `torch`
    # attribute yet (the import system sets it after the module finished executing).
    safetensors_torch = importlib.import_module("safetensors.torch")

    # 7. safetensors (0.8) parses device strings from a fixed list (cpu, cuda, npu, xpu, ...) and rejects others
    #    ("device vnpu is invalid"), though it accepts a device index. safe_open (used by load_file,
    #    transformers and diffusers) gets the index instead of the accelerator's device string.
    orig_open = safetensors.safe_open

    @functools.wraps(orig_open, updated=())
    def safe_open(filename, framework, device="cpu", *args, **kwargs):
        index = _safetensors_device(device, device_type)
        if framework in ("pt", "torch") and isinstance(index, int) and not isinstance(index, bool):
            # 11. get_tensor() onto vnpu reads the tensor from the file into device memory (torch_vnpu.checkpoints)
            handle, file = _open_tracked(orig_open, filename, framework, index, *args, **kwargs)
            return _DeviceSafeOpen(handle, filename, file, torch.device(device_type, index))
        return orig_open(filename, framework, index, *args, **kwargs)

    _set(safetensors, "safe_open", safe_open, f"7, device={device_type!r} -> index")
    _set(safetensors_torch, "safe_open", safe_open, "7")  # safetensors_torch.load_file calls this name
    # Modules that imported the name before enable() (transformers.modeling_utils, accelerate.utils.modeling,
    # ...); later imports pick up the patched name.
    for name, module in list(sys.modules.items()):
        if name.startswith(("safetensors", "torch")) or module is None:
            continue
        if getattr(module, "__dict__", {}).get("safe_open") is orig_open:  # no lazy-module __getattr__
            _set(module, "safe_open", safe_open, "7")
    # 11. load_file(path, device="vnpu") reads the whole file into vnpu memory through pinned staging buffers,
    #     reads and uploads overlapped (torch_vnpu.checkpoints.safetensors), instead of a CPU tensor and a blocking copy
    #     per tensor. Other devices keep safetensors' own load.
    orig_load = safetensors_torch.load_file

    @functools.wraps(orig_load)
    def load_file(filename, device="cpu", **kwargs):
        index = _safetensors_device(device, device_type)  # an int: a vnpu device (safetensors: int i = device i)
        if isinstance(index, int) and not isinstance(index, bool):
            from ..checkpoints.safetensors import load_file as streamed

            return streamed(filename, torch.device(device_type, index))  # reads itself: `backend` has no role
        return orig_load(filename, device=device, **kwargs)

    _set(safetensors_torch, "load_file", load_file, f"11, load_file(device={device_type!r}) streamed")
    # 12. save_file of vnpu tensors: downloaded through pinned buffers and written as they land
    #     (torch_vnpu.checkpoints.safetensors), the same bytes as safetensors writes, instead of a blocking copy
    #     of each tensor to fresh CPU memory. CPU-only dicts and dtypes safetensors.torch does not name (packed
    #     float4, ...) keep safetensors' own save. save_model calls this name.
    orig_save = safetensors_torch.save_file

    @functools.wraps(orig_save)
    def save_file(tensors, filename, metadata=None, **kwargs):
        from ..checkpoints.safetensors import can_save, save_file as streamed

        if not kwargs and can_save(tensors):
            return streamed(tensors, filename, metadata)
        return orig_save(tensors, filename, metadata, **kwargs)

    _set(safetensors_torch, "save_file", save_file, "12, save_file of vnpu tensors streamed")


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


# The library versions this adapter was written and tested against (major.minor). Switched on automatically,
# it leaves any other version alone (with one warning); an explicit enable() patches it anyway.
TESTED_VERSIONS = {"accelerate": "1.15", "transformers": "5.17", "peft": "0.21", "safetensors": "0.8"}

# Part (library) -> the function patching it; applied parts and the patches each made.
_PARTS = {
    "accelerate": lambda t: _patch_accelerate(t),
    "transformers": lambda t: _patch_transformers(t),
    "transformers.generation": lambda t: _patch_transformers_generation(t),
    "transformers.loading": lambda t: _patch_transformers_loading(t),
    "peft": lambda t: _patch_peft(),
    "safetensors": lambda t: _patch_safetensors(t),
}
_applied: dict[str, int] = {}  # part -> index of its first patch in _patches
_mode = "auto"  # "auto": parts are patched when imported; "on": enable() was called; "off": disable() was called
_warned: set[str] = set()


def _version(part: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(part)
    except importlib.metadata.PackageNotFoundError:
        return getattr(sys.modules.get(part), "__version__", "unknown")


def _apply(part: str, device_type: str) -> None:
    """Patch one library (idempotent); on an error undo that library's patches and re-raise."""
    if part in _applied:
        return
    start = len(_patches)
    try:
        _PARTS[part](device_type)
    except BaseException:
        while len(_patches) > start:
            owner, name, original = _patches.pop()
            setattr(owner, name, original)
        raise
    _applied[part] = start


def _on_import(module_name: str) -> None:
    """Called by torch_vnpu.integrations._autoload when ``module_name`` (accelerate, transformers.training_args,
    peft, safetensors) finished importing: patch that library if its version is one this adapter knows."""
    part = {"transformers.generation.utils": "transformers.generation",
            "transformers.modeling_utils": "transformers.loading"}.get(module_name, module_name.split(".", 1)[0])
    library = part.split(".", 1)[0]
    acc = _accelerator()
    if _mode == "off" or acc is None:
        return
    if part == "transformers" and not _installed("accelerate"):
        return
    version = _version(library)
    tested = TESTED_VERSIONS[library]
    if version != tested and not version.startswith(tested + "."):
        if library not in _warned:
            _warned.add(library)
            warnings.warn(
                f"torch_vnpu: {library} {version} is not a version the vnpu adapter knows (tested: {tested}.x); "
                f"{library} is left as it is and will not pick vnpu by itself. Call "
                "torch_vnpu.integrations.huggingface.enable() to patch it anyway, or set "
                "VNPU_INTEGRATIONS=-huggingface to silence this.",
                UserWarning,
                stacklevel=3,
            )
        return
    _apply(part, acc.type)


def enable() -> torch.device:
    """Make accelerate, transformers and peft (those installed) fall back to the current accelerator (under
    torchrun: one process per device, collectives over vccl), and safetensors accept ``device="vnpu[:i]"``.

    Not needed in general: each library is patched when it is first imported (``VNPU_INTEGRATIONS``, see
    ``torch_vnpu.integrations``); ``enable()`` imports and patches every installed one now, whatever
    ``VNPU_INTEGRATIONS`` says and whatever their versions are (a version other than ``TESTED_VERSIONS``
    is patched when its code has the expected shape).

    Idempotent. Returns the accelerator device (e.g. ``device(type='vnpu')``). Patches only
    process-global Python attributes of the installed libraries (listed by :func:`patched_names`) and
    :func:`disable` restores them; it sets no environment variable. Call it before the first
    ``Accelerator``, ``PartialState`` or ``TrainingArguments.device``: accelerate keeps its device in a
    process-wide shared state once created.

    Raises:
        RuntimeError: no accelerator is available (``torch.accelerator.current_accelerator()`` is None), or
            accelerate's code no longer has the shape this adapter patches (unsupported version); in the
            latter case nothing stays patched.
    """
    global _mode
    acc = _accelerator()
    if acc is None:
        raise RuntimeError("torch_vnpu.integrations.huggingface.enable(): no accelerator is available")
    try:
        if _installed("accelerate"):
            _apply("accelerate", acc.type)
            if _installed("transformers"):
                _apply("transformers", acc.type)
        if _installed("transformers"):
            _apply("transformers.generation", acc.type)
            _apply("transformers.loading", acc.type)
        if _installed("peft"):
            _apply("peft", acc.type)
        if _installed("safetensors"):
            _apply("safetensors", acc.type)
    except BaseException:
        disable()
        raise
    _mode = "on"
    return acc


def disable() -> None:
    """Undo :func:`enable` and the automatic patches (no-op if none), and stop patching libraries imported
    later (until :func:`enable`). Devices already chosen by live objects stay as they are; reset accelerate's
    shared state (``AcceleratorState._reset_state(True)``) to re-detect."""
    global _mode
    while _patches:
        owner, name, original = _patches.pop()
        setattr(owner, name, original)
    _applied.clear()
    _mode = "off"


def is_enabled() -> bool:
    """Whether :func:`enable` is in effect."""
    return bool(_patches)


def patched_names() -> list[str]:
    """Qualified names of the attributes :func:`enable` replaced (empty when not enabled)."""
    return [_qualname(owner, name) for owner, name, _ in _patches]


@contextlib.contextmanager
def enabled() -> Iterator[torch.device]:
    """Context manager form: :func:`enable` on entry, :func:`disable` on exit if it was not enabled before."""
    global _mode
    was, mode = is_enabled(), _mode
    device = enable()
    try:
        yield device
    finally:
        if not was:
            disable()
            _mode = mode


def main(argv: list[str] | None = None) -> None:
    """Run a program with the adapter enabled, as ``__main__``:

    ``python -m torch_vnpu.integrations.huggingface script.py [args...]`` (``sys.argv = [script.py, args...]``)
    ``python -m torch_vnpu.integrations.huggingface -m module [args...]`` (e.g. ``-m pytest tests/``)
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv == ["-m"]:
        print(main.__doc__)
        raise SystemExit(0 if argv and argv[0] != "-m" else 2)
    enable()
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
