"""``torch.compile(mode="reduce-overhead")`` on vnpu: Inductor's CUDA-graph trees, recording vnpu graphs.

Inductor's graph trees (``torch/_inductor/cudagraph_trees.py``) warm a compiled graph up, record it into a vnpu
graph in a private memory pool shared along a tree of graphs, replay it after checking its static inputs, re-record
when shapes or static inputs change, and invalidate the outputs a later replay overwrites. The module is written
against ``torch.cuda`` and CUDA's bindings; its logic is device-neutral. This adapter runs Inductor's own code with
each CUDA name answered by vnpu (``_CudaOnVnpu`` and ``_BindingsOnVnpu`` below): nothing of the trees is
re-implemented, and the names it changes are counted so that a different torch fails loudly (``apply`` then warns
and graphs stay off).

What vnpu answers, and where:
- the device module (``torch.cuda.graph``, ``CUDAGraph``, ``Stream``, ``synchronize``, ...): ``torch.vnpu``;
- the caching allocator's graph pool calls (begin/end allocating the current thread to a pool, release, pool
  checkpoints, live-allocation check, raw delete): ``torch_vnpu._C`` (csrc/python/GraphTrees.cpp,
  Note [Graph pool checkpoints]);
- ``Tensor.is_cuda`` in the trees' output checks: ``Tensor.is_vnpu``;
- the gates that admit a graph (one device, and it is CUDA; partitions around non-GPU nodes), and the moving of
  CPU scalars onto the device outside the recorded graph: vnpu;
- a compiled optimizer step made capturable (:func:`apply_optimizer`): vnpu parameters too.

Applied at the first compile (the gates act while Inductor compiles) or when ``torch._inductor.cudagraph_trees``
is imported, whichever comes first, and at the import of ``torch._dynamo.variables.optimizer`` for optimizers
(torch_vnpu._inductor.lazy); only when torch is built without CUDA (then nothing else can use the trees; a CUDA
build keeps them for CUDA and compiles vnpu graphs without graphs, with a warning). Patches
``inductor.graph-trees``, ``inductor.graph-gates`` and ``dynamo.optimizer-capturable`` in the registry.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import textwrap
import warnings
from typing import Any

import torch

from .. import _C
from ..patches import record, replace

_DEVICE = "vnpu"
_applied = False


class _CudaOnVnpu:
    """The ``torch.cuda`` names the trees call, answered by ``torch.vnpu`` (``CUDAGraph`` is ``VNPUGraph``)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.vnpu, "VNPUGraph" if name == "CUDAGraph" else name)


def _no_op(*args: Any) -> None:
    return None


class _BindingsOnVnpu:
    """CUDA's ``torch._C`` bindings that the trees call, answered for vnpu (same arguments and results)."""

    _cuda_beginAllocateCurrentThreadToPool = staticmethod(_C._begin_allocate_current_thread_to_pool)
    _cuda_endAllocateToPool = staticmethod(_C._end_allocate_to_pool)
    _cuda_releasePool = staticmethod(_C._release_pool)
    _cuda_getCheckpointState = staticmethod(_C._get_checkpoint_state)
    _cuda_setCheckpointPoolState = staticmethod(_C._set_checkpoint_pool_state)
    _cuda_checkPoolLiveAllocations = staticmethod(_C._check_pool_live_allocations)
    _cuda_cudaCachingAllocator_raw_delete = staticmethod(_C._caching_allocator_delete)
    _cuda_cudaCachingAllocator_is_enabled = staticmethod(_C._is_caching_allocator_enabled)
    _cuda_isHistoryEnabled = staticmethod(_C._is_history_enabled)
    _construct_CUDA_Tensor_From_Storage_And_Metadata = staticmethod(_C._construct_tensor_from_storage_and_metadata)
    # cuBLAS workspaces and cuDNN's benchmark cache: vnpu has neither.
    _cuda_clearCublasWorkspaces = staticmethod(_no_op)
    _cuda_get_conv_benchmark_empty_cache = staticmethod(lambda: False)
    _cudnn_set_conv_benchmark_empty_cache = staticmethod(_no_op)
    # Device-generic, but bound by torch only in CUDA builds.
    _tensors_data_ptrs_at_indices_equal = staticmethod(_C._tensors_data_ptrs_at_indices_equal)
    _set_storage_access_error_msg = staticmethod(_C._set_storage_access_error_msg)
    _set_storage_data_ptr_access_error_msg = staticmethod(_C._set_storage_data_ptr_access_error_msg)
    _free_And_Remove_DeleterFn = staticmethod(_C._free_and_remove_deleter)
    _has_Standard_Deleter = staticmethod(_C._has_standard_deleter)


_NAMES = {"_vnpu_cuda": _CudaOnVnpu(), "_vnpu_C": _BindingsOnVnpu}
_BINDINGS = "|".join(n for n in vars(_BindingsOnVnpu) if not n.startswith("__"))

# (pattern, replacement) applied to torch 2.13's source; each target states how many of each it has.
_CUDA_MODULE = (r"\btorch\.cuda\.", "_vnpu_cuda.")
_CUDA_BINDING = (rf"\btorch\._C\.({_BINDINGS})\b", r"_vnpu_C.\1")
_IS_CUDA = (r"\.is_cuda\b", ".is_vnpu")
_CUDA_STRING = (r"""(["'])cuda\1""", r"\1vnpu\1")


def _rewrite(source: str, rules: list[tuple[tuple[str, str], int]], what: str) -> str:
    """``source`` with each rule applied; raises if a rule does not match exactly as often as expected."""
    for (pattern, repl), expected in rules:
        source, n = re.subn(pattern, repl, source)
        if n != expected:
            raise RuntimeError(f"{what}: expected {expected} matches of {pattern!r}, found {n} (torch changed; "
                               "re-check torch_vnpu/_inductor/graph_trees.py)")
    return source


def _retarget_function(owner: Any, name: str, rules: list[tuple[tuple[str, str], int]], patch_id: str,
                       extra: dict[str, Any] | None = None) -> None:
    """Replaces ``owner.name`` by its own source rewritten by ``rules``, run in its module's globals."""
    original = inspect.unwrap(getattr(owner, name))
    module = inspect.getmodule(original)
    source = textwrap.dedent(inspect.getsource(original))
    source = _rewrite(source, rules, f"{module.__name__}.{original.__qualname__}")
    # The rewritten function runs in its module's own globals (later changes to them stay visible), which gain
    # the names it now calls.
    module.__dict__.update(_NAMES, **(extra or {}))
    # Line numbers stay those of torch's file, so tracebacks point at the code that ran.
    code = compile("\n" * (original.__code__.co_firstlineno - 1) + source, module.__file__, "exec")
    defined: dict[str, Any] = {}
    exec(code, module.__dict__, defined)
    replace(owner, name, defined[name], patch_id)


def _retarget_trees() -> None:
    import torch._inductor.cudagraph_trees as trees

    path = trees.__file__
    with open(path, encoding="utf-8") as f:
        source = f.read()
    source = _rewrite(source, [(_CUDA_MODULE, 35), (_CUDA_BINDING, 20), (_IS_CUDA, 3)], "cudagraph_trees")
    code = compile(source, path, "exec")
    mark_step = trees.__dict__.get("MarkStepBox")
    trees.__dict__.update(_NAMES)
    exec(code, trees.__dict__)
    patch = "inductor.graph-trees"
    if mark_step is not None:  # a cudagraph_mark_step_begin() made before this stays in force
        replace(trees, "MarkStepBox", mark_step, patch)
    # Defined only when torch is built with CUDA; generic in C++ (at::caching).
    replace(trees, "_set_cached_tensors_enabled", torch._C._set_cached_tensors_enabled, patch)
    replace(trees, "AllocatorState", _C._PoolCheckpoint, patch)
    # torch.cond inside a recording becomes a CUDA conditional node; vnpu graphs have none. Without these modes
    # a cond reached while recording reads its predicate on the host, which the capture refuses with an error.
    replace(trees, "ControlFlowOpWarmupDispatchMode", contextlib.nullcontext, patch)
    replace(trees, "CUDAGraphCaptureControlFlowOpDispatchMode", contextlib.nullcontext, patch)
    # The warm-up and the recording read the caller's inputs on the trees' own stream and may drop the last
    # reference to them there: declare that use (record_stream), as the caching allocator's contract asks, so
    # the sanitizer does not report the free of, e.g., a training step's target tensor as a race.
    replace(trees.CUDAWarmupNode, "run", _inputs_used_on_own_stream(trees.CUDAWarmupNode.run), patch)
    replace(trees.CUDAGraphNode, "_allocate_and_copy_recording_inputs",
            _inputs_used_on_own_stream(trees.CUDAGraphNode._allocate_and_copy_recording_inputs), patch)
    record("inductor.graph-trees", "torch._inductor.cudagraph_trees")


def _inputs_used_on_own_stream(method: Any) -> Any:
    def run(self, inputs, *args, **kwargs):
        for t in inputs:
            if isinstance(t, torch.Tensor) and t.device.type == _DEVICE and t.untyped_storage().data_ptr() != 0:
                t.record_stream(self.stream)
        return method(self, inputs, *args, **kwargs)

    run.__doc__ = method.__doc__
    return run


def _is_graph_device(node: Any) -> bool:
    device = node.get_device()
    return node.is_gpu() or (device is not None and device.type == _DEVICE)


def _first_control_flow_node() -> Any:
    from torch._inductor.virtualized import V

    graph = getattr(V.graph, "module", None)
    if graph is None:
        return None
    for target in (torch.ops.higher_order.cond, torch.ops.higher_order.while_loop):
        nodes = graph.graph.find_nodes(op="call_function", target=target)
        if nodes:
            return nodes[0]
    return None


def _skip_control_flow(original: Any) -> Any:
    """``check_lowering_disable_cudagraph`` that also skips vnpu graphs with ``torch.cond``/``while_loop``: CUDA
    records them as conditional nodes, which vnpu graphs do not have (and partitioning around them trips the
    trees' pool check)."""
    from torch._inductor.cudagraph_utils import format_default_skip_message

    def check_lowering_disable_cudagraph(device_node_mapping):
        on_vnpu = any(d.type == _DEVICE for d in device_node_mapping)
        reason = original(device_node_mapping)
        if reason is None and on_vnpu and (node := _first_control_flow_node()) is not None:
            reason = format_default_skip_message(f"control flow ({node.target}): vnpu graphs have no conditional "
                                                 "nodes")
        return reason

    check_lowering_disable_cudagraph.__doc__ = original.__doc__
    return check_lowering_disable_cudagraph


def _move_cpu_scalars(original: Any) -> Any:
    """``move_constructors_to_gpu`` that also moves CPU scalar tensors (inputs included) used by vnpu ops onto vnpu
    when graphs are recorded with partitioning, as it does for CUDA: the copy is partitioned out of the recorded
    graph. Without it a vnpu kernel of the graph took the scalar's value at recording and kept it at every replay
    (a Python float argument, Dynamo's 0-d CPU tensor, silently frozen)."""
    from torch._inductor import config
    from torch._inductor.fx_passes.post_grad import ConstructorMoverPass

    def move_constructors_to_gpu(graph):
        original(graph)
        if config.triton.cudagraphs and config.graph_partition:
            ConstructorMoverPass(_DEVICE, allow_inputs=True, allow_outputs=True)(graph)

    move_constructors_to_gpu.__doc__ = original.__doc__
    return move_constructors_to_gpu


def apply_optimizer(optimizer: Any) -> None:
    """At the import of ``torch._dynamo.variables.optimizer`` (before Dynamo traces a step): a compiled optimizer
    step on vnpu keeps its step counts on the device (``capturable``), as on CUDA and XPU. With a CPU step count,
    a recorded graph kept the count of its recording (Adam's bias correction frozen: silently wrong steps)."""
    if torch.backends.cuda.is_built():
        return
    patch = "dynamo.optimizer-capturable"
    _retarget_function(optimizer.OptimizerVariable, "_set_capturable",
                       [((r"p\.is_cuda or p\.is_xpu", "p.is_cuda or p.is_xpu or p.is_vnpu"), 1)], patch)
    _retarget_function(optimizer, "_is_static_for_cudagraphs", [(_IS_CUDA, 1)], patch)


def _retarget_gates() -> None:
    from torch._inductor import cudagraph_utils, scheduler
    from torch._inductor.fx_passes import post_grad

    gate = "inductor.graph-gates"
    replace(post_grad, "move_constructors_to_gpu", _move_cpu_scalars(post_grad.move_constructors_to_gpu), gate)
    replace(cudagraph_utils, "check_lowering_disable_cudagraph",
            _skip_control_flow(cudagraph_utils.check_lowering_disable_cudagraph), gate)
    _retarget_function(cudagraph_utils, "check_multiple_devices_or_any_cpu_nodes", [(_CUDA_STRING, 1)], gate)
    _retarget_function(cudagraph_utils, "collect_cuda_data_ptrs", [(_CUDA_STRING, 1)], gate)
    _retarget_function(cudagraph_utils, "check_caching_allocator_for_cudagraphs",
                       [(_CUDA_MODULE, 2), (_CUDA_BINDING, 1)], gate)
    _retarget_function(scheduler.Scheduler, "should_partition",
                       [((r"\bnode\.is_gpu\(\)", "_is_graph_device(node)"), 1)], gate,
                       {"_is_graph_device": _is_graph_device})


def _retarget_simple_cudagraphify() -> None:
    from torch._inductor import compile_fx

    _retarget_function(compile_fx, "cudagraphify_impl", [(_CUDA_MODULE, 8)], "inductor.graph-trees")


def apply() -> bool:
    """Makes ``mode="reduce-overhead"`` record vnpu graphs (idempotent). False when it cannot: torch is built
    with CUDA (the trees stay CUDA's), or torch's code is not what this adapter was checked against (warns)."""
    global _applied
    if _applied:
        return True
    if torch.backends.cuda.is_built():
        return False
    try:
        _retarget_gates()  # first: the trees import collect_cuda_data_ptrs by name
        _retarget_simple_cudagraphify()
        _retarget_trees()
    except (RuntimeError, OSError, TypeError) as e:
        warnings.warn(f"torch_vnpu: graphs under torch.compile stay off: {e}", RuntimeWarning)
        return False
    _applied = True
    return True


def is_applied() -> bool:
    """True once vnpu graphs record under ``mode="reduce-overhead"``."""
    return _applied


__all__ = ["apply", "apply_optimizer", "is_applied"]
