"""``torch.nn.attention.flex_attention`` on vnpu, eager and compiled.

torch 2.13 knows flex_attention on cuda, cpu, xpu, hpu and mps only:

* ``flex_attention`` rejects other devices (``_validate_device``): vnpu is
  accepted, with backward (CPU rejects inputs that require grad).
* Inductor lowers the ``flex_attention`` higher-order op of a cpu graph to its
  C++ flash-attention template, and of every other non-mps graph to Triton.
  A vnpu graph that needs no log-sum-exp (inference, also with grad enabled
  when nothing uses it) gets CPU's C++ template, whose kernel is enqueued on
  the stream like any vnpu kernel.
* CPU's template has no log-sum-exp output and CPU has no backward lowering.
  When a vnpu graph needs them (training: ``flex_attention`` with grad enabled,
  and its ``flex_attention_backward``), vnpu's post-grad pass replaces the
  higher-order op by PyTorch's own dense implementation of it
  (``sdpa_dense``/``sdpa_dense_backward``, the eager kernels), traced into
  the graph; Inductor then fuses it like any graph. It materialises the
  ``(B, H, L, S)`` scores, as eager flex_attention does.
"""

from __future__ import annotations

import operator
from types import ModuleType

import torch

_DEVICE = "vnpu"


def patch_validate_device(module: ModuleType) -> None:
    """Lets ``torch.nn.attention.flex_attention`` accept vnpu tensors (idempotent)."""
    original = module._validate_device
    if getattr(original, "_vnpu_original", None) is not None:
        return

    def _validate_device(query, key, value):
        if query.device.type == _DEVICE:
            return
        original(query, key, value)

    _validate_device._vnpu_original = original  # type: ignore[attr-defined]
    _validate_device.__doc__ = original.__doc__
    from ..patches import replace

    replace(module, "_validate_device", _validate_device, "flex-attention.device")


def register_lowering() -> None:
    """Lowers vnpu's inference ``flex_attention`` with CPU's C++ template (idempotent)."""
    import torch._inductor.kernel.flex.flex_attention  # noqa: F401  (registers the lowering wrapped here)
    from torch._inductor import lowering
    from torch._inductor.kernel.flex.flex_cpu import lower_cpu

    op = torch.ops.higher_order.flex_attention
    original = lowering.lowerings[op]
    if getattr(original, "_vnpu_original", None) is not None:
        return

    def flex_attention(query, *args, **kwargs):
        if query.get_device().type == _DEVICE:
            return lower_cpu(query, *args, **kwargs)
        return original(query, *args, **kwargs)

    flex_attention._vnpu_original = original  # type: ignore[attr-defined]
    lowering.lowerings[op] = flex_attention
    from ..patches import record

    record("inductor.flex-attention-lowering", "torch._inductor.lowering.lowerings[higher_order.flex_attention]")


def _is_vnpu(node) -> bool:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.device.type == _DEVICE


def _needs_dense(node) -> bool:
    """A vnpu flex_attention node that CPU's template cannot lower (it must return the log-sum-exp)."""
    if node.op != "call_function" or not node.args or not _is_vnpu(node.args[0]):
        return False
    if node.target is torch.ops.higher_order.flex_attention_backward:
        return True
    return node.target is torch.ops.higher_order.flex_attention and bool(node.args[6].get("OUTPUT_LOGSUMEXP"))


def _drop_unused_logsumexp(node) -> bool:
    """A forward whose log-sum-exp and max are not used (a graph with grad enabled but no backward) does not
    need them: CPU's template can lower it. Returns whether ``node`` changed."""
    if node.target is not torch.ops.higher_order.flex_attention or not _needs_dense(node):
        return False
    if any(u.target is not operator.getitem or (u.args[1] != 0 and u.users) for u in node.users):
        return False
    for user in list(node.users):
        if user.args[1] != 0:
            node.graph.erase_node(user)
    node.args = (*node.args[:6], {**node.args[6], "OUTPUT_LOGSUMEXP": False}, *node.args[7:])
    return True


def decompose_for_training(gm: torch.fx.GraphModule) -> bool:
    """Replaces the vnpu flex_attention ops that need a log-sum-exp or a backward by their dense
    implementation, traced into ``gm``. Returns whether ``gm`` changed."""
    changed = [n for n in gm.graph.nodes if _drop_unused_logsumexp(n)]
    nodes = [n for n in gm.graph.nodes if _needs_dense(n)]
    for node in nodes:
        _inline_dense(gm, node)
    if nodes or changed:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return bool(nodes or changed)


def _materialize(gm, value):
    """The node's argument with graph nodes replaced: get_attr subgraphs by their modules, others by fake values."""
    if isinstance(value, torch.fx.Node):
        if value.op == "get_attr":
            return getattr(gm, value.target)
        return value.meta["val"]
    if isinstance(value, (tuple, list)):
        return type(value)(_materialize(gm, v) for v in value)
    return value


def _inline_dense(gm: torch.fx.GraphModule, node: torch.fx.Node) -> None:
    from torch._higher_order_ops.flex_attention import sdpa_dense, sdpa_dense_backward
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.virtualized import V
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils import _pytree as pytree

    backward = node.target is torch.ops.higher_order.flex_attention_backward
    dense = sdpa_dense_backward if backward else sdpa_dense
    # Graph inputs of the traced implementation: every tensor (or symbolic int) argument node.
    flat_args, spec = pytree.tree_flatten((node.args, node.kwargs))
    inputs = [a for a in flat_args if isinstance(a, torch.fx.Node) and a.op != "get_attr"]
    input_index = {a: i for i, a in enumerate(inputs)}
    captured_grads = {
        inner.args[1]
        for user in node.users
        if backward and user.args[1] == 3
        for inner in user.users
        if inner.users
    }

    def run(*values):
        resolved = [
            values[input_index[a]] if a in input_index else _materialize(gm, a) for a in flat_args
        ]
        args, kwargs = pytree.tree_unflatten(resolved, spec)
        if backward:
            # The dense backward returns the gradient of a captured buffer only if the buffer requires grad,
            # which graph inputs never do: mark those whose gradient the graph uses.
            args = list(args)
            args[12] = tuple(
                b.detach().requires_grad_() if j in captured_grads and isinstance(b, torch.Tensor) else b
                for j, b in enumerate(args[12])
            )
        result = dense(*args, **kwargs)
        return list(pytree.tree_leaves(result, is_leaf=lambda x: x is None))

    with V.fake_mode:
        traced = make_fx(run, decomposition_table=select_decomp_table(), tracing_mode="real")(
            *[a.meta["val"] for a in inputs]
        )
    # Constants of the traced implementation (e.g. its -inf fill value) become attributes of ``gm``.
    for const in traced.graph.find_nodes(op="get_attr"):
        name = _free_attr_name(gm, "_vnpu_flex_constant")
        setattr(gm, name, getattr(traced, const.target))
        const.target = name
    with gm.graph.inserting_before(node):
        outputs = gm.graph.graph_copy(traced.graph, dict(zip(traced.graph.find_nodes(op="placeholder"), inputs)))
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    _replace_getitems(node, outputs, backward)
    gm.graph.erase_node(node)


def _free_attr_name(gm: torch.fx.GraphModule, prefix: str) -> str:
    i = 0
    while hasattr(gm, f"{prefix}{i}"):
        i += 1
    return f"{prefix}{i}"


def _replace_getitems(node: torch.fx.Node, outputs: list, backward: bool) -> None:
    """Points the users of ``node``'s (nested) tuple at the flat ``outputs``.

    Forward: (out, lse, max). Backward: (dq, dk, dv, (d_captured_0, ...)).
    """
    for user in list(node.users):
        if user.target is not operator.getitem:
            raise NotImplementedError(f"vnpu flex_attention: unexpected use of the op's result: {user.format_node()}")
        if backward and user.args[1] == 3:
            for inner in list(user.users):
                _replace(inner, outputs[3 + inner.args[1]])
            user.graph.erase_node(user)
        else:
            _replace(user, outputs[user.args[1]])


def _replace(getitem: torch.fx.Node, value) -> None:
    if value is None and getitem.users:  # a gradient the dense implementation did not compute
        raise AssertionError(f"vnpu flex_attention: no value for {getitem.format_node()}")
    if value is not None:
        getitem.replace_all_uses_with(value)
    getitem.graph.erase_node(getitem)
