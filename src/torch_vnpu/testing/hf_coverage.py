"""Hugging Face causal-LM architecture sweep: every entry of transformers' causal-LM auto mapping on vnpu vs CPU.

For each ``model_type`` of ``transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` the
sweep builds a tiny random-weight model and checks that vnpu computes what CPU computes:

1. **config**: the family's default config class, shrunk by :func:`shrink_config` (2 layers, hidden 64, 4
   heads, vocab 256, 4 experts, ...; nested sub-configs such as ``text_config`` included; per-layer lists
   such as ``layer_types`` trimmed to the kept layers so that every layer kind of a hybrid model is still
   present), plus per-family overrides in :data:`FAMILY_OVERRIDES` where a family has extra constraints;
2. **build**: ``torch.manual_seed(SEED)``, the model class on CPU in float32, ``eval()`` (no dropout); the
   vnpu model is a copy of the same module (parameters *and* buffers, i.e. the same state) moved to vnpu;
3. **forward**: the same random ``input_ids`` (batch 2, 8 tokens, no special tokens) on both devices,
   logits compared with ``torch.testing.assert_close`` at ``LOGITS_TOL`` (float32);
4. **backward**: loss = ``(logits * w).sum()`` with fixed random ``w``; every parameter's gradient is
   compared by norm: ``||g_vnpu - g_cpu|| <= GRAD_RTOL * ||g_cpu|| + GRAD_ATOL`` (and ``None`` where CPU's is
   ``None``);
5. **generate**: greedy ``generate()`` of ``NEW_TOKENS`` new tokens with the KV cache (``use_cache=True``,
   ``do_sample=False``); tokens must match exactly. Where they differ, the step is a *tie* (not a failure)
   if CPU's own logits of the two chosen tokens differ by less than ``TIE_TOL`` at the first differing step.

Each architecture runs in its own subprocess with a timeout (crash/hang isolation); the worker writes its
result file after every stage so a crash is attributed to the stage that was running. Status per
architecture (:data:`STATUSES`):

* ``pass``: every stage that runs on CPU matches on vnpu;
* ``cpu_failed``: the forward pass fails on CPU too (not a vnpu problem; the CPU error is recorded);
* ``missing_dependency``: the model class needs an optional package that is not installed (named);
* ``harness``: the shrunk config or the model could not be built (a limitation of this sweep);
* ``vnpu_error``: vnpu raised, crashed or hung where CPU did not (ours; first error and failing op recorded);
* ``mismatch``: vnpu ran but its results differ beyond the tolerances (ours).

``torch.vnpu.get_fallback_ops()`` and ``get_extra_copy_ops()`` are recorded per architecture.

With ``compile=True`` (``--compile``) the vnpu model is compiled (``model.compile()``: Inductor, default mode,
automatic dynamic shapes) before stages 3-5, so the forward, the backward (AOTAutograd) and every forward
that ``generate()`` makes run as compiled vnpu graphs; the CPU reference stays eager, the tolerances are the
same (a forward/backward mismatch is then checked against the model compiled on CPU,
:func:`_against_compiled_cpu`); then ``generate()`` with a static cache compiled runs on a fresh vnpu copy for the architectures that
support it (:func:`_static_cache_stage`). Its report is a section of its own in the markdown file (see
:func:`write_markdown`).

Entry points: :func:`main` (command line, see ``scripts/hf_coverage.py``), :func:`run_arch` (one
architecture in this process, used by ``tests/test_hf_archs.py``), :func:`run_sweep`, :func:`write_markdown`.
"""

import argparse
import copy
import fnmatch
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SEED = 0
BATCH, SEQ, NEW_TOKENS = 2, 8, 8
LOGITS_TOL = dict(atol=1e-4, rtol=1e-4)
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-6
TIE_TOL = 1e-4
DEFAULT_TIMEOUT = 600
MSG_LEN = 400
STATUSES = ["pass", "mismatch", "vnpu_error", "cpu_failed", "missing_dependency", "harness"]
OURS = ("mismatch", "vnpu_error")

# --------------------------------------------------------------------------------------------------
# config shrinking
# --------------------------------------------------------------------------------------------------

HIDDEN, HEADS, HEAD_DIM, INTER, VOCAB, MAX_POS, EXPERTS, TOPK = 64, 4, 16, 128, 256, 256, 4, 2

# key -> new value (applied when the key exists with a number); callables get (old value, config dict).
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "decoder_layers", "encoder_layers",
               "num_decoder_layers", "num_encoder_layers")
_SET = {
    # widths
    "hidden_size": HIDDEN, "n_embd": HIDDEN, "d_model": HIDDEN, "n_embed": HIDDEN, "embedding_size": HIDDEN,
    "word_embed_proj_dim": HIDDEN, "emb_dim": HIDDEN, "embed_dim": HIDDEN, "dim_model": HIDDEN,
    "hidden_dim": HIDDEN, "input_embedding_size": HIDDEN, "output_embedding_size": HIDDEN,
    "lru_width": HIDDEN, "backbone_hidden_size": HIDDEN, "attention_hidden_size": HIDDEN,
    "intermediate_size": INTER, "ffn_dim": INTER, "n_inner": INTER, "decoder_ffn_dim": INTER,
    "encoder_ffn_dim": INTER, "d_inner": INTER, "dff": INTER, "dim_ff": INTER, "ffn_hidden_size": INTER,
    "feed_forward_size": INTER, "intermediate_size_mlp": INTER, "dense_intermediate_size": INTER,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64, "shared_intermediate_size": 64,
    "moe_shared_expert_intermediate_size": 64, "expert_ffn_hidden_size": 32,
    # heads
    "num_attention_heads": HEADS, "n_head": HEADS, "n_heads": HEADS, "num_heads": HEADS,
    "decoder_attention_heads": HEADS, "encoder_attention_heads": HEADS, "attention_heads": HEADS,
    "num_decoder_attention_heads": HEADS, "num_encoder_attention_heads": HEADS,
    "swa_num_attention_heads": HEADS,
    "head_dim": HEAD_DIM, "attention_head_dim": HEAD_DIM, "d_head": HEAD_DIM, "dim_head": HEAD_DIM,
    "kv_channels": HEAD_DIM, "attention_head_size": HEAD_DIM, "swa_head_dim": HEAD_DIM,
    "qk_head_dim": 24, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": HEAD_DIM,
    "kv_lora_rank": 32, "q_lora_rank": 48, "o_lora_rank": 32,
    "index_head_dim": HEAD_DIM, "index_n_heads": 2, "index_topk": 4,
    "linear_key_head_dim": HEAD_DIM, "linear_value_head_dim": HEAD_DIM, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_head_dim": HEAD_DIM, "linear_num_heads": HEADS,
    # vocab, positions
    "vocab_size": VOCAB, "max_position_embeddings": MAX_POS, "n_positions": MAX_POS, "n_ctx": MAX_POS,
    "max_target_positions": MAX_POS, "max_source_positions": MAX_POS, "max_seq_len": MAX_POS,
    "context_length": MAX_POS, "model_max_length": MAX_POS,
    # experts
    "num_experts": EXPERTS, "num_local_experts": EXPERTS, "n_routed_experts": EXPERTS,
    "moe_num_experts": EXPERTS,
    "n_group": 2, "topk_group": 1, "num_expert_group": 2,
    # state-space models
    "state_size": 8, "ssm_state_size": 8, "mamba_d_state": 8, "time_step_rank": 8, "mamba_dt_rank": 8,
    "conv1d_width": 4, "mamba_d_ssm": 2 * HIDDEN,
    # misc. families
    "hidden_size_global": HIDDEN, "encoder_hash_byte_group_vocab": 256, "pronunciation_vocab_size": 64,
    "shape_vocab_size": 64, "num_kv_shared_layers": 0,
    "rotary_dim": 8, "embedding_dim": HIDDEN,  # gptj / codegen: partial rotary over the first rotary_dim of head_dim
}
# keys whose default None means "derive from other sizes": given the shrunk value where the model reads them raw
_SET_IF_NONE = {"head_dim": HEAD_DIM, "num_key_value_heads": HEADS}
_TOPK_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_k", "top_k", "topk")
# keys holding layer *indices* (remapped to the kept layers)
_INDEX_LIST_KEYS = ("mlp_only_layers", "moe_layers", "full_attn_idxs", "hybrid_layer_ids", "no_rope_layers_idx",
                    "attn_layer_indices", "global_attention_layers")
# keys holding one entry per layer whose distinct values must all survive the trim (first one found wins)
_TYPE_LIST_KEYS = ("layer_types", "layers_block_type", "block_types", "attention_types", "hybrid_override_pattern",
                   "mlp_layer_types", "attn_layers")
_SKIP_KEYS = {"id2label", "label2id", "rope_parameters", "rope_scaling", "quantization_config",
              "task_specific_params", "torch_dtype", "dtype", "transformers_version", "architectures"}


def _kept_layers(d, n):
    """Indices of the layers to keep out of ``n``: the first layer of each distinct kind in the first
    per-layer kind list found (so hybrid models keep every layer kind), filled up to 2 layers."""
    kinds = None
    for k in _TYPE_LIST_KEYS:
        v = d.get(k)
        if isinstance(v, (list, tuple)) and len(v) == n:
            kinds = list(v)
            break
        if isinstance(v, str) and len(v) == n:  # e.g. nemotron_h's "M-M*-..." pattern
            kinds = list(v)
            break
    keep = []
    if kinds is not None:
        seen = set()
        for i, t in enumerate(kinds):
            key = json.dumps(t, sort_keys=True, default=str)
            if key not in seen:
                seen.add(key)
                keep.append(i)
    for i in range(n):
        if len(keep) >= 2:
            break
        if i not in keep:
            keep.append(i)
    return sorted(keep)


def _shrink_dict(d):
    """Shrink one config level (a ``to_dict()``), recursing into nested sub-config dicts."""
    out = dict(d)
    n_layers = None
    for k in _LAYER_KEYS:
        if isinstance(out.get(k), int) and out[k] > 0:
            n_layers = n_layers or out[k]
    keep = _kept_layers(out, n_layers) if n_layers else None
    old_heads = next((out[k] for k in ("num_attention_heads", "n_head", "n_heads", "num_heads")
                      if isinstance(out.get(k), int)), None)
    for k, v in list(out.items()):
        if v is None and k in _SET_IF_NONE and old_heads is not None:
            out[k] = _SET_IF_NONE[k]
            continue
        if k in _SKIP_KEYS or v is None or isinstance(v, bool):
            continue
        if k == "per_layer_config" and isinstance(v, dict) and keep:
            # {layer index (as a string): overrides} of the kept layers, renumbered
            out[k] = {str(keep.index(int(i))): _shrink_dict(x) for i, x in v.items() if int(i) in keep}
            continue
        if isinstance(v, dict):
            if "model_type" in v or any(isinstance(x, int) for x in v.values()):
                out[k] = _shrink_dict(v)
            continue
        if k in _LAYER_KEYS and isinstance(v, int) and v > 0:
            out[k] = len(keep) if (keep and v == n_layers) else min(v, 2)
        elif k in _SET and isinstance(v, int):
            out[k] = min(v, _SET[k]) if k in ("n_group", "topk_group", "num_expert_group") else _SET[k]
        elif k in _TOPK_KEYS and isinstance(v, int):
            out[k] = min(v, TOPK)
        elif k in ("num_key_value_heads", "num_kv_heads", "swa_num_key_value_heads", "num_query_groups") \
                and isinstance(v, int):
            out[k] = HEADS if (old_heads is not None and v >= old_heads) else (1 if v == 1 else 2)
        elif k in ("sliding_window", "sliding_window_size", "attention_window_size", "window_size") \
                and isinstance(v, int) and v > 0:
            out[k] = min(v, 8)
        elif k in ("vocab_size_per_layer_input", "hidden_size_per_layer_input") and isinstance(v, int) and v > 0:
            out[k] = VOCAB if k.startswith("vocab") else 16
        elif k in ("first_k_dense_replace", "num_dense_layers") and isinstance(v, int):
            out[k] = min(v, 1)
        elif k in ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts") and isinstance(v, int):
            out[k] = min(v, 1)
        elif k == "original_max_position_embeddings" and isinstance(v, int):
            out[k] = min(v, MAX_POS)
        elif k in ("mamba_n_heads", "n_mamba_heads", "mamba_num_heads") and isinstance(v, int):
            out[k] = 8
        elif k in ("mamba_d_head", "mamba_head_dim", "mamba_headdim") and isinstance(v, int):
            out[k] = 16
        elif k in ("mamba_n_groups", "mamba_ngroups", "n_groups") and isinstance(v, int):
            out[k] = 1
        elif k in ("chunk_size", "mamba_chunk_size") and isinstance(v, int) and v > 16:
            out[k] = 16
        elif k in ("num_nextn_predict_layers",) and isinstance(v, int):
            out[k] = 0 if v == 0 else v
        elif isinstance(v, (list, tuple)) and keep and n_layers:
            if k in _INDEX_LIST_KEYS and all(isinstance(x, int) for x in v):
                out[k] = [keep.index(x) for x in v if x in keep]
            elif len(v) == n_layers:
                out[k] = [v[i] for i in keep]
        elif isinstance(v, str) and keep and n_layers and k in _TYPE_LIST_KEYS and len(v) == n_layers:
            out[k] = "".join(v[i] for i in keep)
    # multi-head latent attention (deepseek_v2/v3 style): head_dim is the rotary part of the query/key head
    if isinstance(out.get("qk_rope_head_dim"), int) and isinstance(out.get("head_dim"), int):
        out["head_dim"] = out["qk_rope_head_dim"]
    # special token ids must lie inside the shrunk vocabulary
    vocab = out.get("vocab_size")
    if isinstance(vocab, int):
        nxt = [vocab - 1]

        def fix(x):
            if isinstance(x, int) and x >= vocab:
                nxt[0] -= 1
                return nxt[0] + 1
            return x
        for k, v in list(out.items()):
            if k.endswith(("_token_id", "_token_index", "_token_ids")) or k in ("mask_index", "unk_index"):
                out[k] = [fix(x) for x in v] if isinstance(v, list) else fix(v)
    return out


# Per-family overrides, applied to the shrunk top-level dict (dotted keys reach into sub-configs).
FAMILY_OVERRIDES = {
    # attention / MoE layers every k-th layer: one of each in 2 layers
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1,
              "mamba_dt_rank": 8},
    # defaults that do not build even at full size (None where the model needs a number)
    "deepseek_v2": {"num_experts_per_tok": TOPK},
    "dots1": {"n_routed_experts": EXPERTS, "n_shared_experts": 1, "num_experts_per_tok": TOPK},
    "dbrx": {"attn_config._pop": ["_name_or_path", "output_attentions"], "attn_config.rope_theta": 10000.0,
             "attn_config.clip_qkv": 8.0,
             "ffn_config._pop": ["_name_or_path", "output_attentions"]},
    "qwen4_exp": {"indexer_kv_heads": 1, "indexer_n_heads": 2, "indexer_head_dim": HEAD_DIM, "indexer_budget": 8,
                  "indexer_compress_ratio": 4},
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0,
                                                               "mrope_section": [3, 3, 2]}}},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_hidden_layers": 2},
    # mamba2: expand * hidden_size == num_heads * head_dim
    "mamba2": {"num_heads": 8, "head_dim": 16},
    # reformer: local attention only (LSH attention hashes with random rotations drawn on the model's device,
    # and vnpu's random numbers are not CPU's); no dropout, since its backward runs in train mode only
    "reformer": {"is_decoder": True, "axial_pos_shape": [16, 16], "axial_pos_embds_dim": [32, 32],
                 "lsh_attn_chunk_length": 4, "local_attn_chunk_length": 4, "num_buckets": 4,
                 "attn_layers": ["local", "local"], "num_hidden_layers": 2, "hidden_dropout_prob": 0.0,
                 "local_attention_probs_dropout_prob": 0.0, "lsh_attention_probs_dropout_prob": 0.0,
                 "axial_pos_embds": False},
    # zamba ties the shared transformer of its hybrid layers: keep two of them
    # zamba/zamba2: the shared attention block sees [hidden, embeddings] (twice the hidden size)
    "zamba": {"num_hidden_layers": 3, "layers_block_type": ["mamba", "hybrid", "hybrid"],
              "attention_hidden_size": 2 * HIDDEN, "attention_head_dim": 2 * HIDDEN // HEADS},
    "zamba2": {"attention_hidden_size": 2 * HIDDEN, "attention_head_dim": 2 * HIDDEN // HEADS},
}
FAMILY_OVERRIDES["qwen4_exp_text"] = FAMILY_OVERRIDES["qwen4_exp"]

# Families whose backward pass refuses eval mode (their configs above set every dropout to 0)
TRAIN_MODE_BACKWARD = {"reformer"}

# Families this sweep cannot run standalone, with the reason (reported as ``harness``).
NOT_STANDALONE = {
    "gemma4_assistant": "draft (assistant) model: has no text config of its own and reads the target model's "
                        "shared KV cache",
    "gemma4_unified_assistant": "draft (assistant) model: has no text config of its own and reads the target "
                                "model's shared KV cache",
}


def _apply_overrides(d, over):
    for k, v in over.items():
        tgt = d
        parts = k.split(".")
        for p in parts[:-1]:
            tgt = tgt.setdefault(p, {})
        if parts[-1] == "_pop":
            for x in v:
                tgt.pop(x, None)
        else:
            tgt[parts[-1]] = v
    return d


def shrink_config(model_type):
    """The family's default config, shrunk to a tiny model (see module docstring)."""
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    model_cfg = getattr(_model_class(model_type), "config_class", None)
    if isinstance(model_cfg, type) and model_cfg is not cls:
        cls = model_cfg  # e.g. llama4 -> Llama4ForCausalLM takes the text config
    d = cls().to_dict()
    d = _shrink_dict(d)
    d = _apply_overrides(d, FAMILY_OVERRIDES.get(model_type, {}))
    for k in ("transformers_version", "architectures", "model_type"):
        d.pop(k, None)
    d["use_cache"] = True
    cfg = cls(**d)
    cfg._attn_implementation_autoset = False
    return cfg


# --------------------------------------------------------------------------------------------------
# one architecture
# --------------------------------------------------------------------------------------------------

def _short(msg, n=MSG_LEN):
    msg = " ".join(str(msg).split())
    return msg if len(msg) <= n else msg[: n - 3] + "..."


def _exc(e):
    """A one-line description of an exception: type, head of the message (no C++ backtrace), and the
    innermost frame of the Python traceback that is not in torch/_tensor or this file."""
    text = str(e).strip()
    head = []
    for ln in text.splitlines():
        if ln.startswith("Exception raised from") or ln.strip().startswith("frame #"):
            break
        head.append(ln)
    tb = traceback.extract_tb(e.__traceback__)
    where = ""
    for fr in reversed(tb):
        if "hf_coverage" not in fr.filename:
            where = f" [at {os.path.basename(fr.filename)}:{fr.lineno} {fr.name}]"
            break
    return _short(f"{type(e).__name__}: {' '.join(head)}") + where


_MISSING_RE = re.compile(r"requires the (\S+) librar|No module named '([^']+)'|pip install ([\w\-\[\]]+)", re.I)


def _missing_dep(e):
    """The optional package an ImportError-like exception asks for, or None."""
    if not isinstance(e, (ImportError, ModuleNotFoundError)) and "requires the" not in str(e):
        return None
    m = _MISSING_RE.search(str(e))
    if not m:
        return str(type(e).__name__)
    return next(g for g in m.groups() if g)


def _input_ids(cfg, gen):
    import torch

    tc = cfg.get_text_config()
    vocab = tc.vocab_size
    special = set()
    for c in (cfg, cfg.get_text_config()):
        for k, v in c.to_dict().items():
            if k.endswith(("_token_id", "_token_index")):
                for x in (v if isinstance(v, list) else [v]):
                    if isinstance(x, int):
                        special.add(x)
    allowed = torch.tensor([i for i in range(4, vocab) if i not in special])
    rows = BATCH * getattr(tc, "num_codebooks", 1)  # musicgen decoders: one row per codebook
    idx = torch.randint(0, len(allowed), (rows, SEQ), generator=gen)
    return allowed[idx]


def _model_class(model_type):
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])


def _logits(out):
    return out.logits if hasattr(out, "logits") else out[0]


def _forward_backward(model, ids, w):
    """Logits (detached, CPU) and {param name: grad on CPU or None}."""
    import torch

    model.zero_grad(set_to_none=True)
    if getattr(model, "_hf_cov_train_backward", False):
        model.train()
    logits = _logits(model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False))
    loss = (logits.float() * w).sum()
    loss.backward()
    grads = {n: (None if p.grad is None else p.grad.detach().cpu()) for n, p in model.named_parameters()}
    model.eval()
    return logits.detach().cpu(), grads


def _generate(model, ids, cfg):
    import torch

    tc = cfg.get_text_config()
    pad = getattr(tc, "pad_token_id", None)
    pad = pad if isinstance(pad, int) else 0
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                         do_sample=False, use_cache=True, pad_token_id=pad, return_dict_in_generate=True,
                         output_logits=True, num_beams=1)
    toks = out.sequences[:, ids.shape[1]:].cpu()
    logits = [x.detach().float().cpu() for x in (out.logits or [])]
    return toks, logits


def _generate_static_compiled(model, ids, cfg):
    """Greedy tokens of ``generate()`` with a static KV cache (``cache_implementation="static"``), its decode
    forward compiled by transformers' own auto-compilation (``get_compiled_call``: ``torch.compile`` of the
    model's ``__call__``, Inductor default mode, static shapes), which transformers only enables on cuda/xpu
    unless the compile config says all devices (``CompileConfig._compile_all_devices``)."""
    import torch
    from transformers import CompileConfig

    tc = cfg.get_text_config()
    pad = getattr(tc, "pad_token_id", None)
    pad = pad if isinstance(pad, int) else 0
    compile_config = CompileConfig(mode="default")
    compile_config._compile_all_devices = True
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                         do_sample=False, use_cache=True, pad_token_id=pad, return_dict_in_generate=True,
                         num_beams=1, cache_implementation="static", compile_config=compile_config)
    return out.sequences[:, ids.shape[1]:].cpu()


# What the compiled model may give where eager gives None: AOTAutograd materializes the gradients of graph
# outputs the loss does not use as zeros, so parameters that only reach those outputs get a zero gradient
# (pytorch/pytorch#131794; compiled CPU does the same, e.g. big_bird's unused pooler).
UNUSED_OUTPUT_ZERO_GRAD = "zero gradient where eager gives None (AOTAutograd, pytorch/pytorch#131794)"


def compare_grads(gc, gv, compiled=False, notes=None):
    """Mismatch descriptions of the per-parameter gradients (norm-relative, see module docstring).
    ``compiled``: ``gv`` comes from a compiled model; an all-zero gradient where ``gc`` has None is then
    upstream behaviour (:data:`UNUSED_OUTPUT_ZERO_GRAD`), listed in ``notes`` instead."""
    import torch

    bad = []
    for n, a in gc.items():
        b = gv.get(n)
        if compiled and a is None and b is not None and not b.any():
            if notes is not None:
                notes.append(f"grad {n}: {UNUSED_OUTPUT_ZERO_GRAD}")
            continue
        if a is None or b is None:
            if (a is None) != (b is None):
                bad.append(f"{n}: grad is None on {'cpu' if a is None else 'vnpu'} only")
            continue
        if a.shape != b.shape:
            bad.append(f"{n}: shape {tuple(b.shape)} vs cpu {tuple(a.shape)}")
            continue
        if not torch.isfinite(a).all():
            if not torch.equal(a.isnan(), b.isnan()):
                bad.append(f"{n}: NaN pattern differs")
            continue
        err = (b.double() - a.double()).norm().item()
        ref = a.double().norm().item()
        if not err <= GRAD_RTOL * ref + GRAD_ATOL:
            bad.append(f"{n}: ||diff||={err:.3g} ||g_cpu||={ref:.3g}")
    return bad


def _compiled_cpu_copy(model, cache):
    """A copy of the CPU model with ``model.compile()`` applied, made once per architecture (``cache``): the
    forward/backward and the dynamic-cache generate checks share it (Dynamo compiles each module object anew)."""
    if "model" not in cache:
        cache["model"] = copy.deepcopy(model)
        cache["model"].compile()
    return cache["model"]


def _against_compiled_cpu(model, ids, w, logits_v, grads_v, bad, notes, ref_grads=None, cache=None):
    """``--compile``, after a mismatch against eager CPU: Inductor's fused kernels reorder float sums, which can
    exceed the tolerances where values cancel (e.g. blt's 7e-6 cross-attention gradients). The same model
    compiled on CPU is then the oracle for vnpu's compile path: vnpu passes if it matches compiled CPU within
    the tolerances, or if each gradient's distance to eager CPU (``ref_grads``) is at most twice compiled CPU's
    own (Inductor reorders differently per device: falcon's gradients are 1% off eager on both, 7.2 and 8.7 of
    745). Otherwise the mismatch stands, with the comparison to compiled CPU added."""
    import torch

    model_c = _compiled_cpu_copy(model, {} if cache is None else cache)
    logits_c, grads_c = _forward_backward(model_c, ids, w)
    again = []
    try:
        torch.testing.assert_close(logits_v, logits_c, **LOGITS_TOL)
    except AssertionError as e:
        again.append("logits: " + _short(str(e), 300))
    for n in (x.split(": ", 1)[0] for x in compare_grads(grads_c, grads_v)):
        a, b, c = (ref_grads or {}).get(n), grads_v.get(n), grads_c.get(n)
        if a is not None and b is not None and c is not None and a.shape == b.shape == c.shape:
            err_v = (b.double() - a.double()).norm().item()
            err_c = (c.double() - a.double()).norm().item()
            if err_v <= 2 * err_c + GRAD_ATOL:
                continue
        again += ["grad " + x for x in compare_grads({n: grads_c.get(n)}, {n: grads_v.get(n)})]
    if not again:
        notes.append("differs from eager CPU as the model compiled on CPU does (Inductor's numerics; vnpu "
                     "matches compiled CPU or is as close to eager as it): " + bad[0])
        return []
    return bad + ["against compiled CPU too: " + x for x in again]


def _generate_against_compiled_cpu(model, ids, cfg, tv, note, static=False, cache=None):
    """``--compile``, after generate's tokens differ from eager CPU's: the same generate compiled on CPU (on a
    copy of the CPU model; ``static``: with the static cache, as :func:`_generate_static_compiled`) is the
    oracle, since Inductor's numerics can flip a near-tie at one step and every token after it (doge,
    deepseek_v32). Returns (ok, note): ok when vnpu's tokens equal compiled CPU's."""
    import torch

    if static:
        tc = _generate_static_compiled(copy.deepcopy(model), ids, cfg)
    else:
        tc, _ = _generate(_compiled_cpu_copy(model, {} if cache is None else cache), ids, cfg)
    if torch.equal(tc, tv):
        return True, ("tokens differ from eager CPU's as the model compiled on CPU's do (Inductor's numerics; vnpu "
                      "matches compiled CPU): " + note)
    return False, note + f"; compiled CPU's tokens {tc[0].tolist()} differ too"


def compare_generate(tc, lc, tv):
    """(ok, note): exact token match, or a tie at the first differing step (see module docstring)."""
    if tc.shape == tv.shape and bool((tc == tv).all()):
        return True, ""
    if tc.shape != tv.shape:
        # different length: one side stopped at EOS; compare the common prefix first
        n = min(tc.shape[1], tv.shape[1])
        tc_, tv_ = tc[:, :n], tv[:, :n]
    else:
        n, tc_, tv_ = tc.shape[1], tc, tv
    diff = (tc_ != tv_).nonzero()
    if len(diff) == 0:
        return False, f"lengths differ: cpu {tuple(tc.shape)} vnpu {tuple(tv.shape)}"
    b, s = (int(x) for x in diff[0])
    if s < len(lc):
        row = lc[s][b]
        gap = abs(float(row[tc_[b, s]]) - float(row[tv_[b, s]]))
        if gap <= TIE_TOL * max(1.0, float(row.abs().max())):
            return True, f"tie at step {s} (cpu logits of the two tokens differ by {gap:.2g})"
    return False, f"tokens differ from step {s} (batch {b}): cpu {tc[b].tolist()} vnpu {tv[b].tolist()}"


def run_arch(model_type, device="vnpu", progress=None, attn_implementation=None, compile=False):
    """Run one architecture on CPU and on ``device``; returns the result dict (``status``, ``stage``,
    ``error``, ``details``, ``params``, ``fallback_ops``, ...). ``progress(result)`` is called after every
    stage (the worker process writes its result file there). ``compile``: the ``device`` model runs
    compiled (``torch.compile``, see the module docstring)."""
    import torch

    res = {"arch": model_type, "status": None, "stage": "import", "error": "", "details": [], "notes": [],
           "params": None, "fallback_ops": {}, "extra_copy_ops": {}, "missing": None, "seconds": None}
    t0 = time.time()

    def step(stage):
        res["stage"] = stage
        res["seconds"] = round(time.time() - t0, 1)
        if progress:
            progress(res)

    def done(status, err="", **kw):
        res["status"] = status
        res["error"] = err
        res.update(kw)
        step(res["stage"])
        return res

    step("import")
    try:
        cls = _model_class(model_type)
        if hasattr(cls, "__getattr__") and type(cls).__name__ == "DummyObject":
            cls()  # raises the ImportError that names the backend
    except Exception as e:  # noqa: BLE001
        return done("missing_dependency" if _missing_dep(e) else "harness", _exc(e), missing=_missing_dep(e))

    step("config")
    if model_type in NOT_STANDALONE:
        return done("harness", "not run standalone: " + NOT_STANDALONE[model_type])
    import warnings
    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    try:
        cfg = shrink_config(model_type)
        if attn_implementation:
            cfg._attn_implementation = attn_implementation
        torch.manual_seed(SEED)
        model = cls(cfg).float().eval()
        res["params"] = sum(p.numel() for p in model.parameters())
        model._hf_cov_train_backward = model_type in TRAIN_MODE_BACKWARD
        if hasattr(model, "set_default_language") and getattr(cfg, "languages", None):
            model.set_default_language(cfg.languages[0])  # xmod: language adapters need one
        model_v = copy.deepcopy(model)  # same parameters and buffers (incl. non-persistent ones)
    except Exception as e:  # noqa: BLE001
        dep = _missing_dep(e)
        return done("missing_dependency" if dep else "harness", _exc(e), missing=dep)

    gen = torch.Generator().manual_seed(SEED)
    ids = _input_ids(cfg, gen)
    # CPU reference, stage by stage
    step("cpu_forward")
    try:
        with torch.no_grad():
            ref_logits = _logits(model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False))
        w = torch.randn(ref_logits.shape, generator=gen)
        step("cpu_backward")
        ref_logits, ref_grads = _forward_backward(model, ids, w)
    except Exception as e:  # noqa: BLE001
        dep = _missing_dep(e)
        return done("missing_dependency" if dep else "cpu_failed", _exc(e), missing=dep)
    step("cpu_generate")
    ref_gen = None
    try:
        ref_gen = _generate(model, ids, cfg)
    except Exception as e:  # noqa: BLE001
        res["notes"].append(f"generate skipped: fails on CPU: {_exc(e)}")

    # vnpu
    dev = torch.device(device)
    torch.vnpu.reset_op_stats()
    try:
        step("vnpu_to_device")
        model_v = model_v.to(dev)
        if compile:
            from torch._dynamo.utils import counters

            graphs_before = counters["stats"]["unique_graphs"]
            model_v.compile()
        ids_v, w_v = ids.to(dev), w.to(dev)
        step("vnpu_forward")
        logits_v, grads_v = _forward_backward(model_v, ids_v, w_v)
        torch.vnpu.synchronize()
        bad = []
        compiled_cpu = {}  # the CPU model compiled once, if a check needs it (_compiled_cpu_copy)
        try:
            torch.testing.assert_close(logits_v, ref_logits, **LOGITS_TOL)
        except AssertionError as e:
            bad.append("logits: " + _short(str(e), 300))
        step("vnpu_backward")
        bad += ["grad " + x for x in compare_grads(ref_grads, grads_v, compiled=compile, notes=res["notes"])]
        if compile and bad:
            step("cpu_compiled_check")
            cpu_graphs = counters["stats"]["unique_graphs"]
            bad = _against_compiled_cpu(model, ids, w, logits_v, grads_v, bad, res["notes"], ref_grads,
                                        cache=compiled_cpu)
            graphs_before += counters["stats"]["unique_graphs"] - cpu_graphs  # not the vnpu model's
        if ref_gen is not None:
            step("vnpu_generate")
            tv, _ = _generate(model_v, ids_v, cfg)
            torch.vnpu.synchronize()
            ok, note = compare_generate(ref_gen[0], ref_gen[1], tv)
            if not ok and compile:
                step("cpu_compiled_generate")
                cpu_graphs = counters["stats"]["unique_graphs"]
                ok, note = _generate_against_compiled_cpu(model, ids, cfg, tv, note, cache=compiled_cpu)
                graphs_before += counters["stats"]["unique_graphs"] - cpu_graphs  # not the vnpu model's
            if not ok:
                bad.append("generate: " + note)
            elif note:
                res["notes"].append("generate: " + note)
    except Exception as e:  # noqa: BLE001
        res["fallback_ops"] = torch.vnpu.get_fallback_ops()
        res["extra_copy_ops"] = torch.vnpu.get_extra_copy_ops()
        return done("vnpu_error", _exc(e), failing_op=_failing_op(e))
    res["fallback_ops"] = torch.vnpu.get_fallback_ops()
    res["extra_copy_ops"] = torch.vnpu.get_extra_copy_ops()
    if compile:
        res["compiled_graphs"] = counters["stats"]["unique_graphs"] - graphs_before
        if ref_gen is not None:
            _static_cache_stage(res, model, ids, cfg, ref_gen, dev, step, bad)
    res["stage"] = "done"
    if bad:
        return done("mismatch", bad[0], details=bad[:20])
    return done("pass")


def _static_cache_stage(res, model, ids, cfg, ref_gen, dev, step, bad):
    """``--compile``: greedy generate with a static cache, compiled (:func:`_generate_static_compiled`), on a
    fresh (uncompiled) vnpu copy of the model, against the CPU's eager tokens; ``res["static_cache"]`` is
    "pass", "mismatch", "error", "fails on CPU too" (the same error from the same generate on CPU) or
    "unsupported" (the architecture cannot compile with a static cache: ``_can_compile_fullgraph`` is False),
    ``res["static_cache_graphs"]`` the Dynamo graphs it compiled."""
    import torch
    from torch._dynamo.utils import counters

    if not getattr(model, "_can_compile_fullgraph", False):
        res["static_cache"] = "unsupported"
        return
    step("vnpu_generate_static")
    graphs_before = counters["stats"]["unique_graphs"]
    try:
        model_s = copy.deepcopy(model).to(dev)
        tv = _generate_static_compiled(model_s, ids.to(dev), cfg)
        torch.vnpu.synchronize()
    except Exception as e:  # noqa: BLE001
        error = e
    else:
        error = None
    finally:
        res["static_cache_graphs"] = counters["stats"]["unique_graphs"] - graphs_before
    if error is not None:
        # The same generate on CPU is the oracle: an error it raises too is transformers' or torch's, not vnpu's
        # (llama4's chunked-attention mask builder rejects an argument its own generate passes).
        step("cpu_compiled_generate_static")
        try:
            _generate_static_compiled(copy.deepcopy(model), ids, cfg)
        except Exception as e:  # noqa: BLE001
            if type(e) is type(error) and str(e) == str(error):
                res["static_cache"] = "fails on CPU too"
                res["notes"].append("static-cache generate (compiled) fails on CPU too: " + _exc(error))
                return
        res["static_cache"] = "error"
        bad.append("static-cache generate (compiled): " + _exc(error))
        return
    ok, note = compare_generate(ref_gen[0], ref_gen[1], tv)
    if not ok:
        step("cpu_compiled_generate_static")
        ok, note = _generate_against_compiled_cpu(model, ids, cfg, tv, note, static=True)
    res["static_cache"] = "pass" if ok else "mismatch"
    if not ok:
        bad.append("static-cache generate (compiled): " + note)
    elif note:
        res["notes"].append("static-cache generate: " + note)


_OP_RE = re.compile(r"(aten::[\w.]+)|(?:operator|op) '?([\w.:]+)'?")


def _failing_op(e):
    m = _OP_RE.search(str(e))
    return next((g for g in m.groups() if g), None) if m else None


# --------------------------------------------------------------------------------------------------
# the sweep: one subprocess per architecture
# --------------------------------------------------------------------------------------------------

def all_archs():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _worker_main(arch, result_path, attn_implementation=None, compile=False):
    import torch  # noqa: F401  (loads torch_vnpu)

    def progress(r):
        tmp = result_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(r, f, default=str)
        os.replace(tmp, result_path)

    run_arch(arch, progress=progress, attn_implementation=attn_implementation, compile=compile)
    return 0


def _run_in_subprocess(arch, timeout, attn_implementation=None, compile=False):
    """Run one architecture in a fresh interpreter; crash/hang are attributed to the stage that ran."""
    with tempfile.TemporaryDirectory(prefix="hfcov_") as tmp:
        path = os.path.join(tmp, "result.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", arch, "--result", path]
        if attn_implementation:
            cmd += ["--attn-implementation", attn_implementation]
        if compile:
            cmd += ["--compile"]
        env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
        t0 = time.time()
        try:
            p = subprocess.run(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               timeout=timeout)
            rc, out, hung = p.returncode, p.stdout.decode(errors="replace"), False
        except subprocess.TimeoutExpired as e:
            rc, out, hung = None, (e.stdout or b"").decode(errors="replace"), True
        res = None
        if os.path.exists(path):
            with open(path) as f:
                res = json.load(f)
        if res is None:
            res = {"arch": arch, "status": None, "stage": "import", "error": "", "details": [], "notes": []}
        if res.get("status") is None:
            stage = res.get("stage", "import")
            what = f"timeout after {timeout}s" if hung else f"worker exited with code {rc}"
            tail = _short(" | ".join(out.strip().splitlines()[-3:]), 300)
            res["error"] = f"{what} during {stage}" + (f": {tail}" if tail else "")
            res["status"] = "vnpu_error" if stage.startswith("vnpu") else (
                "cpu_failed" if stage.startswith("cpu") else "harness")
        res["seconds"] = round(time.time() - t0, 1)
        return res


def run_sweep(archs, jobs=1, timeout=DEFAULT_TIMEOUT, log=print, attn_implementation=None, compile=False):
    import torch
    import transformers

    t0 = time.time()
    results = {}

    def one(a):
        r = _run_in_subprocess(a, timeout, attn_implementation, compile)
        results[a] = r
        log(f"[{len(results)}/{len(archs)}] {a}: {r['status']} ({r.get('seconds')}s) {_short(r.get('error', ''), 160)}")
        return r

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        list(ex.map(one, archs))
    return {
        "meta": {"torch": torch.__version__, "transformers": transformers.__version__, "jobs": jobs,
                 "timeout": timeout, "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0)),
                 "duration_s": round(time.time() - t0, 1), "seed": SEED, "batch": BATCH, "seq": SEQ,
                 "new_tokens": NEW_TOKENS, "logits_tol": LOGITS_TOL, "grad_rtol": GRAD_RTOL,
                 "grad_atol": GRAD_ATOL, "tie_tol": TIE_TOL, "attn_implementation": attn_implementation,
                 "compile": compile},
        "archs": {a: results[a] for a in archs},
    }


# --------------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------------

_CATEGORY_RULES = [
    (r"timeout", "timeout / hang"),
    (r"exited with code", "worker crash"),
    (r"NotImplementedError|not implemented for", "op not implemented on vnpu"),
    (r"Expected all tensors to be on the same device|device type", "device mix-up"),
    (r"logits:", "logits mismatch"),
    (r"^grad ", "gradient mismatch"),
    (r"generate:", "generate tokens mismatch"),
]


def failure_category(r):
    msg = r.get("error", "")
    for pat, cat in _CATEGORY_RULES:
        if re.search(pat, msg):
            return cat
    m = re.match(r"(\w+(?:Error|Exception))", msg)
    return f"{m.group(1) if m else 'error'} at {r.get('stage')}"


def _md(s):
    return str(s).replace("|", "\\|").replace("\n", " ")


_COMPILE_BEGIN = "<!-- hf_coverage --compile: generated by scripts/hf_coverage.py --compile; do not edit by hand -->"
_COMPILE_END = "<!-- /hf_coverage --compile -->"


def _split_compile_section(text):
    """(text without the --compile section, the section or "")."""
    i, j = text.find(_COMPILE_BEGIN), text.find(_COMPILE_END)
    if i < 0 or j < i:
        return text, ""
    j += len(_COMPILE_END)
    return (text[:i].rstrip("\n") + "\n" + text[j:].lstrip("\n")).rstrip("\n") + "\n", text[i:j]


def _compile_section(res, command=None):
    archs = res["archs"]
    m = res["meta"]
    counts = {s: sum(1 for r in archs.values() if r["status"] == s) for s in STATUSES}
    runnable = counts["pass"] + counts["mismatch"] + counts["vnpu_error"]
    L = [_COMPILE_BEGIN, "",
         f"## torch.compile (`--compile`): **{counts['pass']} / {runnable}** of the architectures run pass compiled "
         f"({len(archs)} run, of {len(all_archs())} in the mapping)\n",
         "The vnpu model is compiled (`model.compile()`: Inductor, default mode, automatic dynamic shapes), so "
         "the forward, the backward and every forward of `generate()` run as compiled vnpu graphs; the CPU "
         "reference is eager and the checks and tolerances are those above. Where the forward or backward differs "
         "from eager CPU beyond them, or generate's tokens differ, the model compiled on CPU is the oracle: if vnpu "
         "matches it, the difference is Inductor's numerics (a note, not a failure); a zero gradient where eager gives None is AOTAutograd's "
         "(pytorch/pytorch#131794; noted). The eager headline above is for "
         "all architectures; this section only for the ones listed here. \"static-cache generate\": greedy "
         "`generate(cache_implementation=\"static\")` on an uncompiled vnpu copy, its decode forward compiled by "
         "transformers' auto-compilation (enabled for all devices by the compile config), tokens vs eager CPU; "
         "`unsupported` where the architecture cannot compile with a static cache (`_can_compile_fullgraph`); "
         "its result is part of the status.\n",
         f"- torch {m['torch']}, transformers {m['transformers']}, {m['jobs']} job(s), timeout {m['timeout']} s "
         "per architecture"]
    command = m.get("command") or command
    if command:
        L.append(f"- command: `{command}`")
    L.append("- " + ", ".join(f"{s}: {counts[s]}" for s in STATUSES))
    L.append("")
    L.append("| architecture | status (compiled) | Dynamo graphs | static-cache generate (graphs) | cause / notes | s |")
    L.append("|---|---|---:|---|---|---:|")
    for a, r in archs.items():
        cause = r.get("error") or ""
        if r.get("notes"):
            cause = (cause + "; " if cause else "") + "; ".join(r["notes"])
        static = r.get("static_cache", "")
        if "static_cache_graphs" in r:
            static += f" ({r['static_cache_graphs']})"
        L.append(f"| `{a}` | {r['status']} | {r.get('compiled_graphs', '')} | {static} | {_md(_short(cause, 220))} | "
                 f"{r.get('seconds', '')} |")
    L += ["", _COMPILE_END]
    return "\n".join(L)


def write_markdown(res, path, command=None):
    """Writes the report to ``path``. A ``--compile`` run replaces only its own section of the file (the eager
    report is kept); an eager run rewrites the file and keeps the ``--compile`` section."""
    old = ""
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
    eager_text, compile_text = _split_compile_section(old)
    if res["meta"].get("compile"):
        text = eager_text.rstrip("\n") + "\n\n" + _compile_section(res, command) + "\n"
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return
    _write_eager_markdown(res, path, command)
    if compile_text:
        with open(path, "a") as f:
            f.write("\n" + compile_text + "\n")


def _write_eager_markdown(res, path, command=None):
    archs = res["archs"]
    counts = {s: sum(1 for r in archs.values() if r["status"] == s) for s in STATUSES}
    runnable = counts["pass"] + counts["mismatch"] + counts["vnpu_error"]
    m = res["meta"]
    L = ["# Hugging Face causal-LM architecture coverage (vnpu vs CPU)\n",
         "Generated by `scripts/hf_coverage.py` (`make hf-coverage`); do not edit by hand.\n",
         "Every `model_type` of `transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` is built "
         "as a tiny random-weight model (default config shrunk: 2 layers keeping every layer kind, hidden 64, 4 "
         "heads, vocab 256, 4 experts, ...), once on CPU and once as a copy of the same module moved to vnpu. "
         f"Checks: forward logits (float32, atol=rtol={LOGITS_TOL['atol']:g}), backward (every parameter's "
         f"gradient: ||g_vnpu − g_cpu|| ≤ {GRAD_RTOL:g}·||g_cpu|| + {GRAD_ATOL:g}), greedy `generate()` of "
         f"{NEW_TOKENS} new tokens with the KV cache (exact token match; a differing token counts as a tie, not a "
         f"failure, if CPU's logits of the two tokens differ by ≤ {TIE_TOL:g}). Input: batch {BATCH}, {SEQ} random "
         "non-special tokens. Each architecture runs in its own process with a timeout.\n",
         f"- torch {m['torch']}, transformers {m['transformers']}, {m['jobs']} job(s), timeout {m['timeout']} s "
         "per architecture",
         ]
    command = m.get("command") or command
    if command:
        L.append(f"- command: `{command}`")
    if m.get("updated"):
        L.append("- some architectures rerun and merged (`--update`)")
    L.append("")
    L.append(f"## Headline: **{counts['pass']} / {runnable}** architectures that run on CPU pass on vnpu "
             f"({len(archs)} in the mapping)\n")
    L.append("| status | meaning | architectures |")
    L.append("|---|---|---:|")
    meaning = {"pass": "forward, backward and generate match CPU", "mismatch": "vnpu ran, results differ (ours)",
               "vnpu_error": "vnpu raised / crashed / hung, CPU did not (ours)",
               "cpu_failed": "the forward pass fails on CPU too (not ours)",
               "missing_dependency": "needs an optional package that is not installed",
               "harness": "the shrunk config / model could not be built (this sweep's limitation)"}
    for s in STATUSES:
        L.append(f"| `{s}` | {meaning[s]} | {counts[s]} |")
    L.append("")
    ours = [r for r in archs.values() if r["status"] in OURS]
    cats = {}
    for r in ours:
        cats.setdefault(failure_category(r), []).append(r)
    L.append("## Failure categories (ours)\n")
    if cats:
        L.append("| category | architectures | example |")
        L.append("|---|---|---|")
        for c, rs in sorted(cats.items(), key=lambda kv: -len(kv[1])):
            L.append(f"| {_md(c)} | {', '.join('`' + r['arch'] + '`' for r in rs)} | {_md(_short(rs[0]['error'], 200))} |")
    else:
        L.append("None.")
    L.append("")
    other = {}
    for r in archs.values():
        if r["status"] in ("cpu_failed", "harness", "missing_dependency"):
            key = r["status"] + (f": {r.get('missing')}" if r.get("missing") else "")
            other.setdefault(key, []).append(r["arch"])
    L.append("## Not runnable on CPU (not counted)\n")
    if other:
        L.append("| status | architectures |")
        L.append("|---|---|")
        for k, v in sorted(other.items()):
            L.append(f"| {_md(k)} | {', '.join('`' + a + '`' for a in v)} |")
    else:
        L.append("None.")
    L.append("")
    noted = [(a, n) for a, r in archs.items() for n in (r.get("notes") or [])]
    L.append("## Notes (passing architectures with a partial or tied check)\n")
    if noted:
        for a, n in noted:
            L.append(f"- `{a}`: {_md(_short(n, 250))}")
    else:
        L.append("None.")
    L.append("")
    L.append("## Per architecture\n")
    L.append("| architecture | status | params | cause / notes | fallback ops | s |")
    L.append("|---|---|---:|---|---|---:|")
    for a, r in archs.items():
        cause = r.get("error") or ""
        if r.get("notes"):
            cause = (cause + "; " if cause else "") + "; ".join(r["notes"])
        fb = ", ".join(f"`{k}`" for k in (r.get("fallback_ops") or {}))
        p = r.get("params")
        L.append(f"| `{a}` | {r['status']} | {p if p is not None else ''} | {_md(_short(cause, 220))} | {fb} | "
                 f"{r.get('seconds', '')} |")
    L.append("")
    fb_all = {}
    for r in archs.values():
        for k, v in (r.get("fallback_ops") or {}).items():
            e = fb_all.setdefault(k, {"reason": v.get("reason", ""), "archs": []})
            e["archs"].append(r["arch"])
    L.append("## Ops that took a slower path (`torch.vnpu.get_fallback_ops()`, over all architectures)\n")
    if fb_all:
        L.append("| ATen op | architectures | reason |")
        L.append("|---|---:|---|")
        for k, v in sorted(fb_all.items()):
            L.append(f"| `{k}` | {len(v['archs'])} | {_md(_short(v['reason'], 150))} |")
    else:
        L.append("None.")
    L.append("")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--archs", default="*", help="comma-separated fnmatch globs over model_type (default: all)")
    p.add_argument("--jobs", type=int, default=1, help="architectures run in parallel (one process each)")
    p.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT, help="seconds per architecture")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--markdown", help="write the report here")
    p.add_argument("--from-json", help="re-render the report from a previous --json file (no run)")
    p.add_argument("--update", metavar="JSON", help="merge: rerun the selected architectures and replace their "
                   "entries in this previous --json result (the other entries are kept)")
    p.add_argument("--attn-implementation", default=None, help="e.g. eager or sdpa (default: the model's)")
    p.add_argument("--compile", action="store_true", help="run the vnpu model compiled (torch.compile); the report "
                   "goes to its own section of --markdown, the eager report there is kept")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return _worker_main(a.worker, a.result, a.attn_implementation, a.compile)
    if a.from_json:
        with open(a.from_json) as f:
            res = json.load(f)
    else:
        globs = [g.strip() for g in a.archs.split(",") if g.strip()]
        archs = [x for x in all_archs() if any(fnmatch.fnmatch(x, g) for g in globs)]
        res = run_sweep(archs, jobs=a.jobs, timeout=a.timeout, attn_implementation=a.attn_implementation,
                        log=lambda s: print(s, flush=True), compile=a.compile)
        res["meta"]["command"] = "python scripts/hf_coverage.py " + " ".join(argv if argv is not None else sys.argv[1:])
        if a.update:
            with open(a.update) as f:
                old = json.load(f)
            merged = dict(old["archs"])
            merged.update(res["archs"])
            order = all_archs()
            res["archs"] = {x: merged[x] for x in order if x in merged}
            ran = ",".join(a for a in order if a in res["archs"] and a in archs)
            res["meta"]["updated"] = res["meta"]["started"]
            res["meta"]["history"] = old["meta"].get("history", []) + [f"{res['meta']['started']}: {ran}"]
            res["meta"]["started"] = old["meta"]["started"]
            res["meta"]["duration_s"] = old["meta"]["duration_s"] + res["meta"]["duration_s"]
            # One run per batch of architectures: keep the first command, the rest is in the history.
            res["meta"]["command"] = old["meta"].get("command") or res["meta"]["command"]
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    if a.markdown:
        write_markdown(res, a.markdown, command="python scripts/hf_coverage.py " + " ".join(argv or sys.argv[1:]))
    counts = {s: sum(1 for r in res["archs"].values() if r["status"] == s) for s in STATUSES}
    print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
