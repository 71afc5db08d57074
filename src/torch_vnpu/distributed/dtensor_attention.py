"""DTensor sharding strategies for the CPU flash-attention op, which vnpu runs where CUDA runs its flash kernel.

vnpu answers ``scaled_dot_product_attention`` with CUDA's efficient-attention op (csrc/ops/FusedAttention.cpp),
except where CUDA's efficient attention has no support and CPU's choice stands: grouped-query attention
(``enable_gqa=True``), which CUDA gives to its flash kernel. Then ATen runs
``_scaled_dot_product_flash_attention_for_cpu``, for which torch 2.13's DTensor has no strategy ("does not have
a sharding strategy registered"), so tensor-parallel GQA attention on DTensors failed on vnpu (and on every
device that is not CUDA). These are the strategies DTensor gives CUDA's flash op: everything replicated, heads
sharded (``Shard(1)``: query and key/value heads split alike, so each rank keeps its query heads' key/value
groups when the key/value head count is a multiple of the mesh size), or the batch sharded (``Shard(0)``). A
mask is sharded with them along a dimension it has (size > 1), else replicated.
"""

from __future__ import annotations

from types import ModuleType

import torch

_PATCH = "distributed.dtensor-cpu-flash-attention"


def _mask_placement(mask, dim: int):
    from torch.distributed.tensor.placement_types import Replicate, Shard

    return Shard(dim) if mask.shape[dim] > 1 else Replicate()


def _strategies(op_schema, qkv: int):
    """[outputs..., inputs...] placements for one mesh dimension; ``qkv`` = number of leading q/k/v-like
    inputs and outputs handled alike (forward: 2 outputs + q, k, v; backward: 3 grads + 6 inputs)."""
    from torch.distributed.tensor.placement_types import Replicate, Shard

    mask = op_schema.kwargs_schema.get("attn_mask")
    has_mask = mask is not None and hasattr(mask, "strategies")
    out = []
    for placement, mask_dim in ((Replicate(), None), (Shard(1), 1), (Shard(0), 0)):
        row = [placement] * qkv
        if has_mask:
            row.append(Replicate() if mask_dim is None or mask.ndim != 4 else _mask_placement(mask, mask_dim))
        out.append(row)
    return out


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
        mesh = op_schema.get_mesh_from_args()
        return expand_to_full_mesh_op_strategy(mesh, op_schema, _strategies(op_schema, 5), input_index=2)

    def backward_strategy(op_schema):
        # (grad_q, grad_k, grad_v) = f(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, ...)
        mesh = op_schema.get_mesh_from_args(validate=False)
        return expand_to_full_mesh_op_strategy(mesh, op_schema, _strategies(op_schema, 9), input_index=3)

    # dropout_p, is_causal and scale select the computation: part of the strategy cache key.
    propagator.register_op_strategy(forward, forward_strategy,
                                    RuntimeSchemaInfo(3, static_kwargkey=["scale"]))
    propagator.register_op_strategy(backward, backward_strategy,
                                    RuntimeSchemaInfo(6, static_kwargkey=["scale"]))
    record(_PATCH, "DTensor sharding propagator: aten._scaled_dot_product_flash_attention_for_cpu(.backward)")
