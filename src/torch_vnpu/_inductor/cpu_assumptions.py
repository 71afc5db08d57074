"""Places where Inductor 2.13 assumes that a device which is not a GPU is the CPU, or asks "is this the
CPU?" where the answer must be the same for vnpu, whose kernels are CPU kernels and Inductor's C++ code.

Each is narrowed to vnpu here (idempotent; nothing changes for other devices):

1. ``torch._inductor.utils.get_current_backend`` maps every device it does not
   know to ``config.cuda_backend`` ("triton"), so ``CSEProxy`` takes Triton's
   branch for masked loads in C++ kernels and training graphs (e.g. the cross
   entropy backward) fail in ``CppVecKernel``. vnpu's backend is "cpp".
2. ``BaseSchedulerNode.is_cpu`` gates three fusion-time loop rewrites that
   only Triton's SIMD kernels support (loop reordering, index inversion,
   reindexing pointwise nodes for reductions): for vnpu nodes it must answer
   as for CPU ones, or the scheduler fails on C++ kernels.
3. ``torch._inductor.utils.device_need_guard`` is true for GPUs only, so a
   vnpu graph's code has no device guard and its ``empty_strided(...,
   device='vnpu')`` allocations land on the current device, not the graph's
   (a graph on vnpu:1 called while vnpu:0 is current failed with a device
   mismatch). vnpu has devices like a GPU: its graphs get a device guard.
4. ``_make_reduction_inner`` makes argmax/argmin over several dimensions of a
   permuted or non-contiguous input return the logical (row-major) index only
   for Triton and the CPU's C++ backend; for any other device the C++ kernel
   returned an index in memory order: a silently wrong result (argmax over a
   permuted [6, 4, 5] tensor gave 59 instead of 109). vnpu answers as CPU there.
5. ``use_two_step_variance`` picks two-pass variance under CPU's threshold
   (``config.cpp.use_two_step_variance_threshold``) only for CPU, Welford
   otherwise. vnpu takes CPU's choice, so compiled vnpu norms are bitwise the
   compiled CPU ones (layer norm differed in the last bits before). (CPU's
   thresholds for realizing reused intermediates, ``ir.is_cpu``, are not
   taken: with them a broadcast of CPU scalars in torchao's AdamW4bit step was
   realized as a 64x64 CPU buffer feeding a vnpu kernel.)
6. ``use_scatter_fallback`` sends ``scatter_reduce_(..., "sum")`` to ATen's
   kernel on a multi-threaded CPU instead of generating atomic adds (whose
   order, so whose float result, varies from run to run); vnpu likewise.
7. ``GraphLowering.decide_layout_opt`` makes every convolution graph of a
   CPU with mkldnn channels-last, and asks GPU heuristics for other devices.
   vnpu's convolution is the CPU's kernel, so vnpu takes CPU's answer. (Before
   the fake convolution of vnpu tensors gave vnpu's real output format,
   :mod:`.fake_conv`, a channels-last graph read the conv's output with the
   wrong strides: an AOTInductor conv + batch norm model was off by 0.05.)
8. ``div_prim`` turns a division by a constant into a multiplication by its
   reciprocal on every device but the CPU, where it was turned off for
   precision (pytorch/pytorch#157959). ``x * (1/41)`` is not ``x / 41``:
   compiled ``floor(x / 41)`` on vnpu gave 0 for x = 41 (eager and compiled
   CPU: 1), and ``(x / 3)`` of integers differed in the last bit. vnpu
   divides, as CPU does.
9. ``cat`` never lowers to ``pointwise_cat`` on CPU (slower in C++ kernels)
   and may on any other device. On vnpu that path failed to compile
   transformers' ProphetNet (``ValueError: The argument '((0)) + 1' is not
   comparable``: its ``Identity`` index inside a clamp cannot be simplified by
   the scheduler). vnpu concatenates as CPU does, with ``ConcatKernel``, unless
   ``config.force_pointwise_cat`` asks otherwise.
10. ``make_pointwise`` puts a pointwise op on its first GPU input's device, else
    on its first input's. With a 0-dim CPU tensor first (``scale * (a @ b)``,
    ``torch.tensor(0.5) * x``), a vnpu graph got a host CPU kernel that read vnpu
    buffers without waiting for the stream and returned a CPU tensor (wrong
    values when the stream was behind). vnpu is a device there, as CUDA is; the
    CPU scalar is read by value, as for CUDA. ``addcmul``/``addcdiv`` have
    lowerings of their own that take the first operand's device: with a CPU
    ``self`` and vnpu tensors they run on the vnpu device of their tensors too.
11. The convolution lowering peels the bias off into a separate add on every
    device but the CPU (cuDNN is slower with it); in bfloat16 that rounds the
    output twice (0.06 off eager). vnpu's convolution is CPU's, so it keeps
    the bias, as on CPU.
12. The layer norm and batch norm decompositions give the CPU's saved
    statistics (the input's dtype; batch norm in eval mode: empty) only for
    ``device.type == "cpu"``, while eager vnpu (CPU's kernels) returns those.
    With float32 statistics the compiled bfloat16 backward differed from eager
    (batch norm weight gradient 0.29 off, compiled CPU 0.016). vnpu's
    statistics are eager's: input dtype, float32 when a bfloat16/float16 input
    has float32 parameters (ATen's mixed-type batch norm), empty in eval mode.
13. Combo kernels (``config.combo_kernels``) group every node that is not on
    the CPU or MPS, but only Triton-style schedulers can generate them;
    vnpu's C++ scheduling asserted. vnpu nodes stay out of combo kernels, as
    CPU nodes do.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Callable

from ..patches import record, replace

_DEVICE = "vnpu"


def _marked(replacement: Callable, original: Callable) -> Callable:
    """Marks ``replacement`` as vnpu's version of ``original`` (each fix checks the mark: idempotence)."""
    replacement._vnpu_original = original  # type: ignore[attr-defined]
    replacement.__doc__ = original.__doc__
    return replacement


@contextlib.contextmanager
def _set(local: threading.local, attr: str, value):
    """Sets a thread-local flag for the duration of one lowering call, restoring the caller's value."""
    before = getattr(local, attr, None)
    setattr(local, attr, value)
    try:
        yield
    finally:
        setattr(local, attr, before)


def _replace_lowering(original: Callable, replacement: Callable, patch_id: str) -> None:
    """Points every ATen overload whose registered lowering is ``original`` at ``replacement``."""
    from torch._inductor import lowering

    for key, fn in list(lowering.lowerings.items()):
        if fn is original:
            lowering.lowerings[key] = replacement
            record(patch_id, f"torch._inductor.lowering.lowerings[{key}]")


def _rebind(name: str, original: Callable, replacement: Callable, patch_id: str) -> None:
    """Replaces ``torch._inductor.utils.<name>`` in every Inductor module that bound it by name."""
    _marked(replacement, original)
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("torch._inductor") and getattr(module, name, None) is original:
            replace(module, name, replacement, patch_id)


def _fix_get_current_backend() -> None:
    from torch._inductor import utils

    original = utils.get_current_backend
    if getattr(original, "_vnpu_original", None) is not None:
        return

    def get_current_backend(device_type: str | None = None) -> str:
        if not device_type:
            from torch._inductor.virtualized import V

            device_type = V.graph.get_current_device_or_throw().type
        return "cpp" if device_type == _DEVICE else original(device_type)

    _rebind("get_current_backend", original, get_current_backend, "inductor.current-backend")


def _fix_device_need_guard() -> None:
    from torch._inductor import scheduler, utils  # noqa: F401  (scheduler binds the name)

    original = utils.device_need_guard
    if getattr(original, "_vnpu_original", None) is not None:
        return

    def device_need_guard(device: str) -> bool:
        return device == _DEVICE or original(device)

    _rebind("device_need_guard", original, device_need_guard, "inductor.device-guard")


def _fix_is_cpu() -> None:
    from torch._inductor.scheduler import BaseSchedulerNode

    original = BaseSchedulerNode.is_cpu
    if getattr(original, "_vnpu_original", None) is not None:
        return

    def is_cpu(self) -> bool:
        device = self.get_device()
        return original(self) or (device is not None and device.type == _DEVICE)

    _marked(is_cpu, original)
    replace(BaseSchedulerNode, "is_cpu", is_cpu, "inductor.is-cpu")


_ARG_REDUCTIONS = ("argmax", "argmin", "argmax_value", "argmin_value", "argmax_with_value", "argmin_with_value")
_as_cpu = threading.local()  # set while a vnpu reduction asks ir.get_device_type the CPU's question


def _is_vnpu_node(x) -> bool:
    try:
        device = x.get_device()
    except Exception:  # not every IR node has a device
        return False
    return device is not None and device.type == _DEVICE


def _fix_logical_index_reductions() -> None:
    from torch._inductor import ir, lowering

    original_type = ir.get_device_type
    if getattr(original_type, "_vnpu_original", None) is not None:
        return

    def get_device_type(x):
        result = original_type(x)
        return "cpu" if result == _DEVICE and getattr(_as_cpu, "active", False) else result

    _marked(get_device_type, original_type)
    replace(ir, "get_device_type", get_device_type, "inductor.logical-index-reductions")

    original_inner = lowering._make_reduction_inner

    def _make_reduction_inner(x, *, axis, keepdims, dtype, override_return_dtype, reduction_type=None):
        kwargs = dict(axis=axis, keepdims=keepdims, dtype=dtype, override_return_dtype=override_return_dtype,
                      reduction_type=reduction_type)
        if reduction_type not in _ARG_REDUCTIONS or not _is_vnpu_node(x):
            return original_inner(x, **kwargs)
        with _set(_as_cpu, "active", True):
            return original_inner(x, **kwargs)

    _marked(_make_reduction_inner, original_inner)
    replace(lowering, "_make_reduction_inner", _make_reduction_inner, "inductor.logical-index-reductions")


def _fix_cpu_heuristics() -> None:
    import sympy
    from torch._inductor import config, lowering
    from torch._inductor.utils import sympy_product

    original_two_step = lowering.use_two_step_variance
    if getattr(original_two_step, "_vnpu_original", None) is not None:
        return

    def use_two_step_variance(x, axis, keepdim, input_dtype):
        if not _is_vnpu_node(x):
            return original_two_step(x, axis, keepdim, input_dtype)
        # CPU's rule: two passes for a static reduction of at most the C++ threshold that is not a
        # reduction to one value.
        inner = lowering._make_reduction_inner(x, axis=axis, keepdims=keepdim, dtype=None,
                                               override_return_dtype=None)
        numel = sympy_product(inner["reduction_ranges"])
        return (isinstance(numel, sympy.Integer) and int(numel) <= config.cpp.use_two_step_variance_threshold
                and sympy_product(inner["ranges"]) != 1)

    _marked(use_two_step_variance, original_two_step)
    replace(lowering, "use_two_step_variance", use_two_step_variance, "inductor.cpu-heuristics")

    from torch._inductor import utils

    original_scatter = utils.use_scatter_fallback

    def use_scatter_fallback(op_overload, reduction_type, self_dtype, src_dtype, src_device_type, src_is_tensor):
        if src_device_type == _DEVICE:
            src_device_type = "cpu"
        return original_scatter(op_overload, reduction_type, self_dtype, src_dtype, src_device_type, src_is_tensor)

    _rebind("use_scatter_fallback", original_scatter, use_scatter_fallback, "inductor.cpu-heuristics")


def _fix_layout_opt() -> None:
    import torch
    from torch._inductor.graph import GraphLowering

    original = GraphLowering.__dict__["decide_layout_opt"].__func__
    if getattr(original, "_vnpu_original", None) is not None:
        return

    def decide_layout_opt(gm, *, is_inference: bool) -> bool:
        from torch._inductor import config

        convs = [n for n in gm.graph.nodes if n.target is torch.ops.aten.convolution.default]
        on_vnpu = bool(convs) and all(
            hasattr(n.args[i], "meta") and getattr(n.args[i].meta.get("val"), "device", None) is not None
            and n.args[i].meta["val"].device.type == _DEVICE
            for n in convs for i in (0, 1))
        if on_vnpu and config.layout_optimization and not config.force_layout_optimization:
            return torch.backends.mkldnn.enabled and torch.backends.mkldnn.is_available()
        return original(gm, is_inference=is_inference)

    _marked(decide_layout_opt, original)
    replace(GraphLowering, "decide_layout_opt", staticmethod(decide_layout_opt), "inductor.layout-opt")


_dividing_on_vnpu = threading.local()  # set while div_prim lowers a vnpu division


def _fix_division_by_constant() -> None:
    from torch._inductor import lowering

    original_constant = lowering.get_constant_value
    if getattr(original_constant, "_vnpu_original", None) is not None:
        return

    def get_constant_value(x):
        # div_prim's only question: "is the divisor a constant?"; for vnpu the CPU's answer (divide).
        return None if getattr(_dividing_on_vnpu, "active", False) else original_constant(x)

    _marked(get_constant_value, original_constant)
    replace(lowering, "get_constant_value", get_constant_value, "inductor.division-by-constant")

    original_div = lowering.div_prim  # the registered lowering (aten.div's lowering calls it by name too)

    def div_prim(a, b):
        if not _is_vnpu_node(a):
            return original_div(a, b)
        with _set(_dividing_on_vnpu, "active", True):
            return original_div(a, b)

    _marked(div_prim, original_div)
    replace(lowering, "div_prim", div_prim, "inductor.division-by-constant")
    _replace_lowering(original_div, div_prim, "inductor.division-by-constant")


def _fix_pointwise_cat() -> None:
    from torch._inductor import config, ir, lowering

    original = lowering.pointwise_cat
    if getattr(original, "_vnpu_original", None) is not None:
        return

    def pointwise_cat(inputs, dim=0):
        # ``cat`` calls this by name, after its input checks and dtype promotion; CPU's branch at this point.
        if config.force_pointwise_cat or not _is_vnpu_node(inputs[0]):
            return original(inputs, dim)
        return ir.TensorBox(ir.ConcatKernel.create(inputs, dim))

    _marked(pointwise_cat, original)
    replace(lowering, "pointwise_cat", pointwise_cat, "inductor.pointwise-cat")


def _fix_pointwise_device() -> None:
    from torch._inductor import lowering

    original = lowering.is_gpu  # only make_pointwise's device choice asks it in lowering.py
    if getattr(original, "_vnpu_original", None) is not None:
        return

    def is_gpu(device: str | None) -> bool:
        return device == _DEVICE or original(device)

    _marked(is_gpu, original)
    replace(lowering, "is_gpu", is_gpu, "inductor.pointwise-device")

    from torch._inductor import ir

    create = ir.Pointwise.create.__func__

    def pointwise_create(cls, *args, **kwargs):
        device = getattr(_pointwise_device, "device", None)
        if device is not None and getattr(kwargs.get("device"), "type", None) == "cpu":
            kwargs["device"] = device
        return create(cls, *args, **kwargs)

    replace(ir.Pointwise, "create", classmethod(pointwise_create), "inductor.pointwise-device")
    import torch

    for op in (torch.ops.aten.addcmul, torch.ops.aten.addcdiv):
        for overload in op.overloads():
            key = getattr(op, overload)
            if key in lowering.lowerings:
                lowering.lowerings[key] = _on_the_tensors_device(lowering.lowerings[key])
                record("inductor.pointwise-device", f"torch._inductor.lowering.lowerings[{key}]")


_pointwise_device = threading.local()  # set while a lowering with a CPU first operand lowers onto vnpu


def _on_the_tensors_device(lower: Callable) -> Callable:
    def wrapper(self, *args, **kwargs):
        device = next((a.get_device() for a in args if _is_vnpu_node(a)), None)
        if device is None or _is_vnpu_node(self):
            return lower(self, *args, **kwargs)
        with _set(_pointwise_device, "device", device):
            return lower(self, *args, **kwargs)

    _marked(wrapper, lower)
    return wrapper


def _fix_convolution_bias() -> None:
    from torch._inductor.kernel import conv

    original = conv.convolution
    if getattr(original, "_vnpu_original", None) is not None:
        return
    _fix_logical_index_reductions()  # installs the get_device_type that answers "cpu" under _as_cpu

    def convolution(x, weight, bias, *args, **kwargs):
        if not _is_vnpu_node(x):
            return original(x, weight, bias, *args, **kwargs)
        with _set(_as_cpu, "active", True):
            return original(x, weight, bias, *args, **kwargs)

    _marked(convolution, original)
    replace(conv, "convolution", convolution, "inductor.convolution-bias")
    _replace_lowering(original, convolution, "inductor.convolution-bias")


def _eager_norm_stats_dtype(input, *params):
    import torch

    low = (torch.bfloat16, torch.float16)
    mixed = input.dtype in low and any(p is not None and p.dtype == torch.float32 for p in params)
    return torch.float32 if mixed else input.dtype


def _fix_norm_statistics() -> None:
    import torch
    import torch._decomp as decomp
    import torch._decomp.decompositions as decompositions
    import torch._refs as refs
    from torch._inductor import decomposition as inductor_decomposition

    original_ln = refs.native_layer_norm
    if getattr(original_ln, "_vnpu_original", None) is not None:
        return

    def native_layer_norm(input, normalized_shape, weight, bias, eps, **kwargs):
        out, mean, rstd = original_ln(input, normalized_shape, weight, bias, eps, **kwargs)
        if input.device.type == _DEVICE and not kwargs:
            mean, rstd = mean.to(input.dtype), rstd.to(input.dtype)  # CPU's kernel: input dtype
        return out, mean, rstd

    _marked(native_layer_norm, original_ln)
    # the fake impl calls it by this name
    replace(refs, "native_layer_norm", native_layer_norm, "inductor.norm-statistics")
    replace(inductor_decomposition, "decomp_native_layer_norm", native_layer_norm, "inductor.norm-statistics")
    op = torch.ops.aten.native_layer_norm.default
    if decomp.decomposition_table.get(op) is original_ln:
        decomp.decomposition_table[op] = native_layer_norm
        record("inductor.norm-statistics", "torch._decomp.decomposition_table[aten.native_layer_norm.default]")

    original_bn = decompositions.native_batch_norm_helper  # every batch norm decomposition calls it by name

    def native_batch_norm_helper(input, weight, bias, running_mean, running_var, training, momentum, eps,
                                 functional):
        result = original_bn(input, weight, bias, running_mean, running_var, training, momentum, eps, functional)
        if input.device.type != _DEVICE:
            return result
        output, save_mean, save_rstd, new_mean, new_var = result
        if not training:  # CPU's kernel saves no statistics in eval mode
            save_mean, save_rstd = input.new_zeros((0,)), input.new_zeros((0,))
        dtype = _eager_norm_stats_dtype(input, weight, bias, running_mean, running_var)
        return output, save_mean.to(dtype), save_rstd.to(dtype), new_mean, new_var

    _marked(native_batch_norm_helper, original_bn)
    replace(decompositions, "native_batch_norm_helper", native_batch_norm_helper, "inductor.norm-statistics")


def _fix_combo_kernels() -> None:
    from torch._inductor.scheduler import ForeachKernelSchedulerNode

    original = ForeachKernelSchedulerNode.__dict__["group_nodes_for_combo_kernels"].__func__
    if getattr(original, "_vnpu_original", None) is not None:
        return

    def group_nodes_for_combo_kernels(scheduler):
        return [g for g in original(scheduler) if not any(_is_vnpu_node(n) for n in g)]

    _marked(group_nodes_for_combo_kernels, original)
    replace(ForeachKernelSchedulerNode, "group_nodes_for_combo_kernels", staticmethod(group_nodes_for_combo_kernels),
            "inductor.combo-kernels")


def apply() -> None:
    """Applies the fixes (idempotent)."""
    _fix_get_current_backend()
    _fix_is_cpu()
    _fix_device_need_guard()
    _fix_logical_index_reductions()
    _fix_cpu_heuristics()
    _fix_layout_opt()
    _fix_division_by_constant()
    _fix_pointwise_cat()
    _fix_pointwise_device()
    _fix_convolution_bias()
    _fix_norm_statistics()
    _fix_combo_kernels()
