"""A Hugging Face Trainer script written for CUDA (a tiny random-init Llama trained with Trainer, then greedy
generation on "cuda" after training; bf16 when torch.cuda.is_bf16_supported()). Run unedited by
tests/test_port.py under ``python -m torch_vnpu.port.run``; ``--cpu`` is the CPU run. Offline, in-memory data.
Writes a JSON report to --out.
"""
import argparse
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


class Counting(torch.utils.data.Dataset):
    def __init__(self, n, length, vocab):
        g = torch.Generator().manual_seed(1)
        self.rows = (torch.randint(0, vocab, (n, 1), generator=g) + torch.arange(length)) % vocab

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--out", default="hf.json")
    parser.add_argument("--output-dir", default="hf_out")
    args = parser.parse_args()
    device = "cpu" if args.cpu else "cuda"
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    training_args = TrainingArguments(
        output_dir=args.output_dir, use_cpu=args.cpu, max_steps=3, per_device_train_batch_size=4,
        learning_rate=5e-3, logging_steps=1, save_strategy="no", report_to=[], seed=0, disable_tqdm=True,
        bf16=args.bf16 and torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=Counting(16, 24, 64))
    trainer.train()
    model = trainer.model.to(device).eval()
    prompt = torch.tensor([[3, 4, 5, 6]]).to(device)
    with torch.no_grad():
        generated = model.generate(prompt, max_new_tokens=4, do_sample=False)
    report = {
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "args_device": str(training_args.device),
        "param_devices": sorted({p.device.type for p in trainer.model.parameters()}),
        "generated": generated.tolist(),
        "generated_device": str(generated.device),
        "bf16": training_args.bf16,
    }
    with open(args.out, "w") as f:
        json.dump(report, f)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
