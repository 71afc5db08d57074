"""DTensor sharding strategies for the CPU flash-attention op, which vnpu runs where CUDA runs its flash kernel.

vnpu answers ``scaled_dot_product_attention`` with CUDA's efficient-attention op (csrc/ops/FusedAttention.cpp),
except where CUDA's efficient attention has no support and CPU's choice stands: grouped-query attention
(``enable_gqa=True``), which CUDA gives to its flash kernel. Then ATen runs
``_scaled_dot_product_flash_attention_for_cpu``, for which torch 2.13's DTensor has no strategy ("does not have
a sharding strategy registered"), so tensor-parallel GQA attention on DTensors failed on vnpu (and on every
device that is not CUDA). These are the strategies DTensor gives CUDA's flash op: everything replicated, heads
sharded (``Shard(1)``: query and key/value heads split alike, offered only when both head counts are multiples of
the mesh size, so that each rank keeps its query heads' key/value groups), or the batch sharded (``Shard(0)``).
DTensor does not redistribute a keyword argument, so the mask (``attn_mask=``) keeps the placement it has: only
strategies that use it as placed are offered, and none (a clear NotImplementedError) when it fits none.
Context parallelism (ring attention) has no implementation of this op: it raises rather than attend over an
all-gathered, load-balanced (permuted) sequence.
"""

from __future__ import annotations

from types import ModuleType

import torch

_PATCH = "distributed.dtensor-cpu-flash-attention"


def _mask_placement(mask, dim: int):
    from torch.distributed.tensor.placement_types import Replicate, Shard

    return Shard(dim) if mask.shape[dim] > 1 else Replicate()


def _strategies(op_schema, qkv: int, q_index: int, k_index: int):
    """[outputs..., inputs...] placements for one mesh dimension; ``qkv`` = number of leading q/k/v-like
    inputs and outputs handled alike (forward: 2 outputs + q, k, v; backward: 3 grads + 6 inputs)."""
    from torch.distributed.tensor.placement_types import Replicate, Shard

    mesh = op_schema.get_mesh_from_args(validate=False)
    q, k = op_schema.args_schema[q_index], op_schema.args_schema[k_index]
    heads_divide = q.shape[1] % mesh.size() == 0 and k.shape[1] % mesh.size() == 0
    mask = op_schema.kwargs_schema.get("attn_mask")
    has_mask = mask is not None and hasattr(mask, "strategies")
    out = []
    for placement, mask_dim in ((Replicate(), None), (Shard(1), 1), (Shard(0), 0)):
        if mask_dim == 1 and not heads_divide:
            continue
        row = [placement] * qkv
        if has_mask:
            row.append(Replicate() if mask_dim is None or mask.ndim != 4 else _mask_placement(mask, mask_dim))
        out.append(row)
    return out


def _check_supported(op_schema) -> None:
    from torch.distributed.tensor import DTensor

    if torch.ops.aten._scaled_dot_product_efficient_attention.default in DTensor._op_dispatcher._custom_op_handlers:
        raise NotImplementedError(
            "context parallelism with scaled_dot_product_attention(..., enable_gqa=True) is not supported on vnpu "
            "(CPU's flash-attention op has no ring implementation): repeat the key/value heads to the query's "
            "(k.repeat_interleave(q.size(1) // k.size(1), dim=1)) and call it without enable_gqa")


def _keep_mask_as_placed(op_schema, strategy, mask_input: int):
    """Only the strategies that take the mask (a keyword argument DTensor does not redistribute) as it is."""
    mask = op_schema.kwargs_schema.get("attn_mask")
    if mask is None or not hasattr(mask, "strategies"):
        return strategy
    current = mask.strategies[0].output_spec.placements
    kept = [s for s in strategy.strategies if s.input_specs[mask_input].placements == current]
    if not kept:
        raise NotImplementedError(
            f"scaled_dot_product_attention with enable_gqa=True on DTensors: no sharding takes an attn_mask placed "
            f"{tuple(current)} as it is (DTensor does not redistribute it); replicate the mask, or shard it on "
            "the batch dimension along with the query, key and value")
    strategy.strategies = kept
    return strategy


def register(_module: ModuleType | None = None) -> None:
    """Registers the forward and backward strategies with DTensor (idempotent; torch's own one wins)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy

    from ..patches import record

    aten = torch.ops.aten
    forward = aten._scaled_dot_product_flash_attention_for_cpu.default
    backward = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    propagator = DTensor._op_dispatcher.sharding_propagator
    if forward in propagator.op_strategy_funcs:
        return

    def forward_strategy(op_schema):
        # (output, logsumexp) = f(query, key, value, dropout_p, is_causal, *, attn_mask, scale)
        _check_supported(op_schema)
        mesh = op_schema.get_mesh_from_args()
        strategy = expand_to_full_mesh_op_strategy(mesh, op_schema, _strategies(op_schema, 5, 0, 1), input_index=2)
        return _keep_mask_as_placed(op_schema, strategy, mask_input=3)

    def backward_strategy(op_schema):
        # (grad_q, grad_k, grad_v) = f(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, ...)
        _check_supported(op_schema)
        mesh = op_schema.get_mesh_from_args(validate=False)
        strategy = expand_to_full_mesh_op_strategy(mesh, op_schema, _strategies(op_schema, 9, 1, 2), input_index=3)
        return _keep_mask_as_placed(op_schema, strategy, mask_input=6)

    # dropout_p, is_causal and scale select the computation: part of the strategy cache key.
    propagator.register_op_strategy(forward, forward_strategy,
                                    RuntimeSchemaInfo(3, static_kwargkey=["scale"]))
    propagator.register_op_strategy(backward, backward_strategy,
                                    RuntimeSchemaInfo(6, static_kwargkey=["scale"]))
    record(_PATCH, "DTensor sharding propagator: aten._scaled_dot_product_flash_attention_for_cpu(.backward)")
