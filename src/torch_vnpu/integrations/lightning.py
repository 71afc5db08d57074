"""Adapter: PyTorch Lightning (``lightning.pytorch`` / ``pytorch_lightning``) and Lightning Fabric
(``lightning.fabric`` / ``lightning_fabric``) train on vnpu.

Switched on when Lightning is imported (``torch_vnpu.integrations``; ``VNPU_INTEGRATIONS=-lightning`` turns it
off), or explicitly with :func:`enable`. Written and tested against lightning 2.6 (``TESTED_VERSION``); another
version is left alone with one warning. What it does, for both the Trainer and Fabric:

1. registers ``VNPUAccelerator`` as ``"vnpu"`` in Lightning's accelerator registry, so ``accelerator="vnpu"``
   and ``devices=N`` / ``devices=[i, j]`` / ``devices="0,1"`` / ``devices=-1`` work (like ``CUDAAccelerator``);
2. ``accelerator="auto"`` (the default) picks ``"vnpu"`` where Lightning would end in ``"cpu"``;
   ``devices="auto"`` is every visible vnpu device (``torch.vnpu.device_count()``, set by ``VNPU_DEVICE_COUNT`` /
   ``VNPU_VISIBLE_DEVICES``), one in an interactive session: what Lightning does for CUDA GPUs;
3. one device: Lightning's connectors only put a single-device run on the device for CUDA/MPS and otherwise
   on the CPU: for vnpu the ``SingleDeviceStrategy`` gets ``vnpu:<i>``;
4. ``precision="16-mixed"`` / ``"bf16-mixed"``: Lightning makes ``MixedPrecision(device="cuda")`` for any
   accelerator but cpu/mps (autocast and GradScaler disabled without CUDA): for vnpu it is
   ``MixedPrecision(device="vnpu")`` (``torch.autocast("vnpu")``, ``torch.amp.GradScaler("vnpu")`` for fp16);
   with FSDP, an ``FSDPPrecision`` whose forward autocasts vnpu and whose fp16 scaler is a vnpu
   ``ShardedGradScaler``;
5. ``strategy="ddp"`` (several devices): Lightning builds ``DistributedDataParallel`` inside
   ``torch.cuda.stream(torch.cuda.Stream())`` whenever it has device ids, which raises without CUDA: for vnpu
   the side stream is a vnpu stream, and the current stream waits for it afterwards (DDP's initial broadcast
   of the parameters ran there);
6. ``strategy="fsdp"``: Lightning refuses it for any accelerator flag but ``"cuda"``/``"gpu"`` (a check of the
   flag only): accepted for vnpu (torch's FSDP runs on the root device); with ``precision="*-mixed"`` its
   ``FSDPPrecision`` (autocast ``"cuda"``, a CUDA ``ShardedGradScaler``) is replaced by one on vnpu (patch 4);
7. the Trainer's device banner adds ``VNPU available: True (vnpu), used: True`` after its GPU/TPU lines.

Several devices use Lightning's ``"ddp"``/``"fsdp"`` strategies and its launcher (the script is started once
more per extra device); the process-group backend Lightning picks from
``torch.distributed.Backend.default_device_backend_map`` is vccl for vnpu.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import sys
import warnings

import torch

from .. import patches

__all__ = ["enable", "disable", "is_enabled", "patched_names", "TESTED_VERSION"]

logger = logging.getLogger("torch_vnpu.integrations")

TESTED_VERSION = "2.6"
_DEVICE = "vnpu"

# (fabric package, trainer package or None): the unified ``lightning`` package and the standalone ones.
_FLAVOURS = {
    "lightning.fabric": ("lightning.fabric", None),
    "lightning_fabric": ("lightning_fabric", None),
    "lightning.pytorch": ("lightning.fabric", "lightning.pytorch"),
    "pytorch_lightning": ("lightning_fabric", "pytorch_lightning"),
}

_patches: list[tuple[object, str, object, bool]] = []  # (owner, name, original, owner had it in __dict__)
_registered: list[tuple[object, str]] = []  # (registry, name)
_applied: set[str] = set()
_accelerator_classes: list[type] = []
_mode = "auto"
_warned = False


def _set(owner: object, name: str, value: object, why: str) -> None:
    had = name in vars(owner)
    _patches.append((owner, name, vars(owner)[name] if had else getattr(owner, name, None), had))
    patches.replace(owner, name, value, "lightning.accelerator")
    logger.debug("lightning adapter: patched %s.%s: %s", _owner_name(owner), name, why)


def _owner_name(owner: object) -> str:
    if isinstance(owner, type(sys)):
        return owner.__name__
    return f"{owner.__module__}.{owner.__qualname__}"


def _parse_devices(devices, error: type[Exception]) -> list[int] | None:
    """Lightning's ``devices`` argument (int, ``-1``, list of indices, ``"0,1"``, ``"2"``) -> vnpu indices."""
    count = torch.vnpu.device_count()
    if isinstance(devices, str):
        text = devices.strip()
        if text == "-1":
            devices = -1
        elif "," in text:
            devices = [int(x) for x in text.split(",") if x.strip()]
        else:
            devices = int(text)
    if devices == -1:
        return list(range(count))
    if isinstance(devices, int):
        if devices < 0:
            raise error(f"devices={devices}: pass a number of vnpu devices, -1 for all, or a list of indices")
        devices = list(range(devices))
    devices = list(devices)
    if not devices:
        return None
    bad = [i for i in devices if not 0 <= int(i) < count]
    if bad or len(devices) > count:
        raise error(
            f"devices={devices}: {count} vnpu device(s) are visible (indices 0..{count - 1}); set "
            "VNPU_DEVICE_COUNT for more"
        )
    return [int(i) for i in devices]


def _make_accelerator(base: type, error: type[Exception], trainer: bool) -> type:
    """A Lightning ``Accelerator`` subclass for vnpu on the given Fabric or Trainer base class."""

    class VNPUAccelerator(base):
        """Accelerator for vnpu devices (mirrors Lightning's ``CUDAAccelerator``)."""

        def setup_device(self, device: torch.device) -> None:
            if device.type != _DEVICE:
                raise error(f"Device should be vnpu, got {device} instead")
            torch.vnpu.set_device(device)

        def teardown(self) -> None:
            pass

        @staticmethod
        def parse_devices(devices):
            return _parse_devices(devices, error)

        @staticmethod
        def get_parallel_devices(devices):
            return [torch.device(_DEVICE, i) for i in devices]

        @staticmethod
        def auto_device_count() -> int:
            """Every visible vnpu device, as ``CUDAAccelerator`` counts every visible GPU."""
            return torch.vnpu.device_count()

        @staticmethod
        def is_available() -> bool:
            return torch.vnpu.is_available()

        @staticmethod
        def name() -> str:
            return _DEVICE

        @classmethod
        def register_accelerators(cls, accelerator_registry) -> None:
            accelerator_registry.register(cls.name(), cls, description=cls.__name__)
            patches.record("lightning.accelerator", "lightning accelerator registry['vnpu']")

        if trainer:

            def get_device_stats(self, device) -> dict:
                """``torch.vnpu.memory_stats(device)``, as CUDAAccelerator returns ``torch.cuda.memory_stats``."""
                return torch.vnpu.memory_stats(device)

    VNPUAccelerator.__module__ = __name__
    VNPUAccelerator.__qualname__ = "VNPUAccelerator"  # Lightning names it in "... can not run on your system"
    return VNPUAccelerator


def _is_vnpu(flag) -> bool:
    return flag == _DEVICE or isinstance(flag, tuple(_accelerator_classes))


def _make_fsdp_precision(base: type) -> type:
    """Lightning's ``FSDPPrecision`` autocasting vnpu (its own autocasts ``"cuda"``), with a vnpu
    ``ShardedGradScaler`` for ``"16-mixed"`` (its own is a CUDA one)."""

    class VNPUFSDPPrecision(base):
        def __init__(self, precision, scaler=None) -> None:
            if scaler is None and precision == "16-mixed":
                from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

                scaler = ShardedGradScaler(device=_DEVICE)
                # Lightning 2.6 checks the scaler against self.precision before setting it (the class default
                # "32-true"), refusing any scaler given for "16-mixed".
                self.precision = precision
            super().__init__(precision, scaler)

        def forward_context(self):
            if "mixed" in self.precision:
                return torch.autocast(_DEVICE, dtype=torch.bfloat16 if self.precision == "bf16-mixed" else torch.float16)
            return super().forward_context()

    VNPUFSDPPrecision.__module__ = __name__
    return VNPUFSDPPrecision


def _port_mode() -> bool:
    """CUDA port mode (torch_vnpu.port) is on: Lightning's CUDA choices mean vnpu."""
    port = sys.modules.get("torch_vnpu.port._cuda")
    return port is not None and port.is_enabled()


def _patch_connector(cls: type, strategies, mixed_precision: type, precision_base: type, trainer: bool,
                     fsdp_precision: type, cuda_accelerator: type) -> None:
    # 7. Port mode: accelerator="gpu" / "cuda" (or a CUDAAccelerator) is the vnpu accelerator, as device="cuda"
    # is vnpu for torch. Outside port mode Lightning's own rules apply ("No supported gpu backend found!").
    orig_flags = cls.__dict__["_check_config_and_set_final_flags"]
    signature = inspect.signature(orig_flags)

    @functools.wraps(orig_flags)
    def _check_config_and_set_final_flags(self, *args, **kwargs):
        if _port_mode():
            bound = signature.bind(self, *args, **kwargs)
            accelerator = bound.arguments.get("accelerator")
            if (isinstance(accelerator, str) and accelerator.lower() in ("gpu", "cuda")) or (
                    type(accelerator) is cuda_accelerator):
                bound.arguments["accelerator"] = _DEVICE
                logger.debug("lightning adapter: port mode: accelerator=%r -> %r", accelerator, _DEVICE)
                return orig_flags(*bound.args, **bound.kwargs)
        return orig_flags(self, *args, **kwargs)

    _set(cls, "_check_config_and_set_final_flags", _check_config_and_set_final_flags,
         "7, port mode: accelerator='gpu'/'cuda' -> vnpu")

    # 2. accelerator="auto": the connector's own choice ends in "cpu" for anything but TPU/MPS/CUDA.
    orig_auto = cls.__dict__["_choose_auto_accelerator"]

    @functools.wraps(orig_auto.__func__)
    def _choose_auto_accelerator(*args) -> str:
        chosen = orig_auto.__func__(*args)
        return _DEVICE if chosen == "cpu" and torch.vnpu.is_available() else chosen

    _set(cls, "_choose_auto_accelerator", staticmethod(_choose_auto_accelerator), "2, auto -> vnpu")

    # 3. One device: SingleDeviceStrategy(device="cpu") for any accelerator but CUDA/MPS.
    orig_strategy = cls.__dict__["_choose_strategy"]

    @functools.wraps(orig_strategy)
    def _choose_strategy(self):
        strategy = orig_strategy(self)
        if (
            _is_vnpu(self._accelerator_flag)
            and isinstance(strategy, strategies.SingleDeviceStrategy)
            and strategy.root_device.type == "cpu"
        ):
            devices = self._parallel_devices
            return strategies.SingleDeviceStrategy(device=devices[0] if devices else torch.device(_DEVICE, 0))
        return strategy

    _set(cls, "_choose_strategy", _choose_strategy, "3, single device -> vnpu:<i>")

    # 4. Mixed precision: MixedPrecision(device="cuda") for any accelerator but cpu/mps; FSDPPrecision autocasts
    # "cuda" and scales with a CUDA ShardedGradScaler.
    orig_precision = cls.__dict__["_check_and_init_precision"]
    vnpu_fsdp_precision = _make_fsdp_precision(fsdp_precision)
    flag_name, instance_name = ("_precision_flag", "_precision_plugin_flag") if trainer else (
        "_precision_input", "_precision_instance")

    @functools.wraps(orig_precision)
    def _check_and_init_precision(self):
        precision = getattr(self, flag_name)
        if (
            _is_vnpu(self._accelerator_flag)
            and precision in ("16-mixed", "bf16-mixed")
            and not isinstance(getattr(self, instance_name), precision_base)
            and type(self.strategy).__name__ in ("SingleDeviceStrategy", "DDPStrategy")
        ):
            if trainer:
                self._validate_precision_choice()
            return mixed_precision(precision, _DEVICE)
        if (
            _is_vnpu(self._accelerator_flag)
            and precision in ("16-mixed", "bf16-mixed")
            and not isinstance(getattr(self, instance_name), precision_base)
            and isinstance(self.strategy, strategies.FSDPStrategy)
        ):
            if trainer:
                self._validate_precision_choice()
            return vnpu_fsdp_precision(precision)
        return orig_precision(self)

    _set(cls, "_check_and_init_precision", _check_and_init_precision, "4, MixedPrecision(device='vnpu')")

    # 2. devices="auto" in an interactive session: Lightning uses one of several CUDA GPUs there (its "ddp_fork"
    # would fork a process that already initialized the device); the same for vnpu.
    orig_auto_devices = cls.__dict__["_set_devices_flag_if_auto_passed"]
    connector_module = sys.modules[cls.__module__]

    @functools.wraps(orig_auto_devices)
    def _set_devices_flag_if_auto_passed(self) -> None:
        if (
            self._devices_flag == "auto"
            and isinstance(self.accelerator, tuple(_accelerator_classes))
            and getattr(connector_module, "_IS_INTERACTIVE", False)
            and self.accelerator.auto_device_count() > 1
        ):
            self._devices_flag = 1
            connector_module.rank_zero_info(
                f"{'Trainer' if trainer else 'Fabric'} will use only 1 of {self.accelerator.auto_device_count()} "
                f"vnpu devices because it is running inside an interactive / notebook environment (as for CUDA "
                "GPUs). Pass devices=N and run the code as a script to use more."
            )
            return
        orig_auto_devices(self)

    _set(cls, "_set_devices_flag_if_auto_passed", _set_devices_flag_if_auto_passed, "2, devices='auto' interactive")


def _patch_fsdp_check(cls: type, strategies) -> None:
    # 6. strategy="fsdp": Lightning accepts it only with accelerator="cuda"/"gpu" (a check on the flag alone; the
    # strategy itself runs torch's FSDP on the root device, which vnpu supports).
    orig = cls.__dict__["_check_strategy_and_fallback"]
    fsdp_cls = strategies.FSDPStrategy
    names = fsdp_cls.get_registered_strategies() if hasattr(fsdp_cls, "get_registered_strategies") else \
        sys.modules[fsdp_cls.__module__]._FSDP_ALIASES  # Trainer / Fabric

    @functools.wraps(orig)
    def _check_strategy_and_fallback(self) -> None:
        flag = self._strategy_flag
        fsdp = (isinstance(flag, str) and flag in names) or type(flag) is fsdp_cls
        if not (fsdp and _is_vnpu(self._accelerator_flag)):
            return orig(self)
        accelerator = self._accelerator_flag
        self._accelerator_flag = "cuda"  # read by the checks only; restored before anything else uses it
        try:
            return orig(self)
        finally:
            self._accelerator_flag = accelerator

    _set(cls, "_check_strategy_and_fallback", _check_strategy_and_fallback, "6, fsdp accepted on vnpu")


def _patch_ddp(ddp: type, method: str, device_ids: str) -> None:
    # 5. DDP's constructor on a side stream: Lightning's is torch.cuda.Stream().
    from torch.nn.parallel import DistributedDataParallel

    orig = ddp.__dict__[method]

    @functools.wraps(orig)
    def setup(self, module):
        if self.root_device.type != _DEVICE:
            return orig(self, module)
        ids = getattr(self, device_ids)()
        side = torch.vnpu.Stream(self.root_device)
        with torch.vnpu.stream(side):
            wrapped = DistributedDataParallel(module=module, device_ids=ids, **self._ddp_kwargs)
        # The parameters were broadcast on the side stream; training runs on the current one.
        torch.vnpu.current_stream(self.root_device).wait_stream(side)
        return wrapped

    _set(ddp, method, setup, "5, DDP wrapped on a vnpu side stream")


def _patch_launcher(module_name: str) -> None:
    # 7. Port mode with several devices: Lightning's launcher starts the script again per extra device
    # (``python script.py args`` / ``python -m module args``); those processes must run in port mode too.
    launcher = importlib.import_module(module_name)
    orig = launcher._basic_subprocess_cmd

    @functools.wraps(orig)
    def _basic_subprocess_cmd():
        command = list(orig())
        if _port_mode() and command[1:3] != ["-m", "torch_vnpu.port.run"]:
            command[1:1] = ["-m", "torch_vnpu.port.run"]
        return command

    _set(launcher, "_basic_subprocess_cmd", _basic_subprocess_cmd, "7, port mode: ranks started under port.run")


def _patch_fabric(fabric: str) -> None:
    accelerators = importlib.import_module(f"{fabric}.accelerators")
    connector = importlib.import_module(f"{fabric}.connector")
    strategies = importlib.import_module(f"{fabric}.strategies")
    precision = importlib.import_module(f"{fabric}.plugins.precision")
    acc = _make_accelerator(accelerators.Accelerator, ValueError, trainer=False)
    _accelerator_classes.append(acc)
    _register(accelerators.ACCELERATOR_REGISTRY, acc)
    _patch_connector(connector._Connector, strategies, precision.MixedPrecision, precision.Precision, trainer=False,
                     fsdp_precision=precision.FSDPPrecision, cuda_accelerator=accelerators.CUDAAccelerator)
    _patch_ddp(strategies.DDPStrategy, "setup_module", "_determine_ddp_device_ids")
    _patch_launcher(f"{fabric}.strategies.launchers.subprocess_script")
    _patch_fsdp_check(connector._Connector, strategies)


def _patch_trainer(pl: str) -> None:
    accelerators = importlib.import_module(f"{pl}.accelerators")
    connector = importlib.import_module(f"{pl}.trainer.connectors.accelerator_connector")
    strategies = importlib.import_module(f"{pl}.strategies")
    precision = importlib.import_module(f"{pl}.plugins.precision")
    error = importlib.import_module(f"{pl}.utilities.exceptions").MisconfigurationException
    acc = _make_accelerator(accelerators.Accelerator, error, trainer=True)
    _accelerator_classes.append(acc)
    _register(accelerators.AcceleratorRegistry, acc)
    _patch_connector(connector._AcceleratorConnector, strategies, precision.MixedPrecision, precision.Precision,
                     trainer=True, fsdp_precision=precision.FSDPPrecision, cuda_accelerator=accelerators.CUDAAccelerator)
    _patch_ddp(strategies.DDPStrategy, "_setup_model", "determine_ddp_device_ids")
    _patch_launcher(f"{pl}.strategies.launchers.subprocess_script")
    _patch_fsdp_check(connector._AcceleratorConnector, strategies)
    _patch_device_banner(importlib.import_module(f"{pl}.trainer.setup"), acc)


def _patch_device_banner(setup, acc: type) -> None:
    # 7. The Trainer's banner lists GPU/TPU/HPU availability only: add vnpu's line in its form.
    original = setup._log_device_info

    @functools.wraps(original)
    def _log_device_info(trainer) -> None:
        original(trainer)
        used = isinstance(trainer.accelerator, acc)
        setup.rank_zero_info(f"VNPU available: {acc.is_available()} ({_DEVICE}), used: {used}")

    _set(setup, "_log_device_info", _log_device_info, "the banner says whether vnpu is available and used")


def _register(registry, acc: type) -> None:
    # 1. accelerator="vnpu".
    if _DEVICE not in registry:
        acc.register_accelerators(registry)
        _registered.append((registry, _DEVICE))
        logger.debug("lightning adapter: registered %s as %r in %s", acc.__qualname__, _DEVICE, type(registry))


def _apply(name: str) -> None:
    fabric, pl = _FLAVOURS[name]
    for part, patch in ((fabric, _patch_fabric), (pl, _patch_trainer)):
        if part is None or part in _applied:
            continue
        start, reg_start, acc_start = len(_patches), len(_registered), len(_accelerator_classes)
        try:
            patch(part)
        except BaseException:
            _undo(start, reg_start, acc_start)
            raise
        _applied.add(part)


def _undo(start: int = 0, reg_start: int = 0, acc_start: int = 0) -> None:
    while len(_patches) > start:
        owner, name, original, had = _patches.pop()
        if had:
            setattr(owner, name, original)
        else:
            delattr(owner, name)
    while len(_registered) > reg_start:
        registry, name = _registered.pop()
        registry.pop(name, None)
    del _accelerator_classes[acc_start:]


def _version() -> str:
    import importlib.metadata

    for dist in ("lightning", "pytorch-lightning", "lightning-fabric"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def _on_import(module_name: str) -> None:
    """Called by ``torch_vnpu.integrations._autoload`` when a Lightning package finished importing."""
    global _warned
    if _mode == "off":
        return
    # Also with no vnpu device visible: accelerator="vnpu" then gets Lightning's own "`VNPUAccelerator` can not
    # run on your system since the accelerator is not available" (as CUDAAccelerator without a GPU), and "auto"
    # keeps choosing the CPU.
    version = _version()
    if version != TESTED_VERSION and not version.startswith(TESTED_VERSION + "."):
        if not _warned:
            _warned = True
            warnings.warn(
                f"torch_vnpu: lightning {version} is not a version the vnpu adapter knows (tested: "
                f"{TESTED_VERSION}.x); Lightning is left as it is (accelerator='vnpu' is unknown to it). Call "
                "torch_vnpu.integrations.lightning.enable() to patch it anyway, or set VNPU_INTEGRATIONS=-lightning "
                "to silence this.",
                UserWarning,
                stacklevel=3,
            )
        return
    _apply(module_name)


def enable() -> torch.device:
    """Patch the Lightning packages imported so far and those installed (imports them). Idempotent.

    Returns ``torch.device("vnpu")``. Raises ``RuntimeError`` if vnpu is not available."""
    global _mode
    if not torch.vnpu.is_available():
        raise RuntimeError("torch_vnpu.integrations.lightning.enable(): vnpu is not available")
    import importlib.util

    for name in ("lightning.pytorch", "pytorch_lightning"):
        top = name.split(".")[0]
        if importlib.util.find_spec(top) is not None:
            importlib.import_module(name)
            _apply(name)
    _mode = "on"
    return torch.device(_DEVICE)


def disable() -> None:
    """Undo every patch and registration, and stop patching Lightning packages imported later."""
    global _mode
    _undo()
    _applied.clear()
    _mode = "off"


def is_enabled() -> bool:
    return bool(_patches)


def patched_names() -> list[str]:
    return [f"{_owner_name(o)}.{n}" for o, n, _, _ in _patches] + [
        f"{type(r).__name__}[{n!r}]" for r, n in _registered
    ]

