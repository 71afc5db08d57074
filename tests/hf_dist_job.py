"""A tiny random-init Llama trained with accelerate (DDP or FSDP2 plugin) or the transformers `Trainer` (DDP or
FSDP2), in one process or under torchrun; used by tests/test_hf_distributed.py.

Every run sees the same global batch per optimizer step whatever the world size (``--global-batch`` split
evenly over the ranks, accelerate's batch sharding: rank r gets batch r, r + world, ...), so a run under
torchrun must reproduce the single-process run. Rank 0 writes ``<out>/result.json`` (losses, placement) and
``<out>/params.pt`` (the full state dict on CPU, gathered from the shards for FSDP2).

Multi-process, through the adapter's runner (which calls ``enable()`` first)::

    torchrun --nproc-per-node 2 -m torch_vnpu.integrations.huggingface tests/hf_dist_job.py \\
        --job accelerate --fsdp2 --out /tmp/x
    accelerate launch --multi_gpu --num_processes 2 -m torch_vnpu.integrations.huggingface tests/hf_dist_job.py \\
        --job accelerate --out /tmp/x

One process: call ``main([...])`` with the adapter enabled (the test does), or the same command without torchrun.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB, SEQ = 64, 24


def tiny_llama():
    """2 layers, hidden 32: random init from seed 0, the same on every rank and in the reference."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


class TokenDataset(torch.utils.data.Dataset):
    """Counting sequences (next token = previous + 1 mod vocab) from random starts; no padding, so every
    rank's mean token loss has the same weight and their mean is the global batch's loss."""

    def __init__(self, n: int):
        g = torch.Generator().manual_seed(1)
        self.rows = (torch.randint(0, VOCAB, (n, 1), generator=g) + torch.arange(SEQ)) % VOCAB

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def _fsdp2_plugin():
    from accelerate import FullyShardedDataParallelPlugin

    return FullyShardedDataParallelPlugin(
        fsdp_version=2, reshard_after_forward=True, auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["LlamaDecoderLayer"], state_dict_type="FULL_STATE_DICT",
    )


def run_accelerate(args) -> dict:
    from accelerate import Accelerator

    accelerator = Accelerator(
        fsdp_plugin=_fsdp2_plugin() if args.fsdp2 else None,  # else what the launcher configured
        gradient_accumulation_steps=args.grad_accum,
    )
    world = accelerator.num_processes
    model = tiny_llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    n = args.steps * args.grad_accum * args.global_batch
    loader = torch.utils.data.DataLoader(TokenDataset(n), batch_size=args.global_batch // world, shuffle=False)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []  # one per micro-batch: the mean over the ranks of each rank's mean token loss
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), "mean").item())
    state = accelerator.get_state_dict(model)  # collective for FSDP2: every rank calls it
    return _result(accelerator, model, losses, state, args)


def run_trainer(args) -> dict:
    from transformers import Trainer, TrainingArguments

    world = int(os.environ.get("WORLD_SIZE", 1))
    fsdp = {}
    if args.fsdp2:
        fsdp = dict(fsdp=True, fsdp_config={"version": 2, "reshard_after_forward": True,
                                            "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"],
                                            "state_dict_type": "FULL_STATE_DICT"})
    targs = TrainingArguments(
        output_dir=os.path.join(args.out, "trainer"), max_steps=args.steps,
        per_device_train_batch_size=args.global_batch // world, gradient_accumulation_steps=args.grad_accum,
        learning_rate=5e-3, logging_steps=1, save_strategy="no", report_to=[], seed=0, dataloader_num_workers=0,
        disable_tqdm=True, **fsdp,
    )
    n = args.steps * args.grad_accum * args.global_batch
    trainer = Trainer(model=tiny_llama(), args=targs, train_dataset=TokenDataset(n))
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    state = trainer.accelerator.get_state_dict(trainer.model)
    return _result(trainer.accelerator, trainer.model_wrapped, losses, state, args)  # model_wrapped: DDP/FSDP


def _result(accelerator, model, losses, state, args) -> dict:
    params = list(model.parameters())
    result = {
        "world_size": accelerator.num_processes,
        "distributed_type": str(accelerator.distributed_type.value),
        "backend": accelerator.state.backend,
        "device": str(accelerator.device),
        "param_devices": sorted({str(p.device) for p in params}),
        "param_types": sorted({type(p.data).__name__ for p in params}),
        "model_type": type(model).__name__,
        "mixed_precision": accelerator.mixed_precision,
        "scaler": None if accelerator.scaler is None else [type(accelerator.scaler).__name__, accelerator.scaler._device,
                                                          accelerator.scaler.is_enabled(), accelerator.scaler.get_scale()],
        "losses": losses,
    }
    if accelerator.is_main_process:
        os.makedirs(args.out, exist_ok=True)
        torch.save({k: v.detach().cpu() for k, v in state.items()}, os.path.join(args.out, "params.pt"))
        with open(os.path.join(args.out, "result.json"), "w") as f:
            json.dump(result, f)
    accelerator.wait_for_everyone()
    return result


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--job", choices=["accelerate", "trainer"], required=True)
    parser.add_argument("--fsdp2", action="store_true", help="FSDP2 configured in the script (accelerate: a "
                        "FullyShardedDataParallelPlugin; Trainer: fsdp_config); without it accelerate uses what "
                        "`accelerate launch` configured (DDP, or FSDP with --use_fsdp), the Trainer DDP")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps")
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--global-batch", type=int, default=8, help="sequences per micro-step over all ranks")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    result = run_accelerate(args) if args.job == "accelerate" else run_trainer(args)
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"[{args.job} x{result['world_size']}] {result['distributed_type']} "
              f"{result['backend']} {result['device']} losses {result['losses']}", flush=True)
    return result


if __name__ == "__main__":
    main()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
