"""Extra-copy ops of a transformers Llama training loop on vnpu (issue #15).

An op that has no usable `out=` overload runs its functional CPU kernel and copies the result into device
memory (one extra pass over the output); `torch.vnpu.get_extra_copy_ops()` counts those per op. This trains a
4-layer Llama (hidden 256, batch 4 x 128, random weights, AdamW) for --steps steps and prints the counts.

    cd tests && ../.venv/bin/python ../scripts/llama_extra_copies.py [--steps 11]
"""
import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=11)
    args = p.parse_args()
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=4, vocab_size=1000, max_position_embeddings=256)
    model = LlamaForCausalLM(cfg).to("vnpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, cfg.vocab_size, (4, 128), device="vnpu")
    torch.vnpu.synchronize()
    before = dict(torch.vnpu.get_extra_copy_ops())  # model construction and init
    for _ in range(args.steps):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    torch.vnpu.synchronize()
    after = torch.vnpu.get_extra_copy_ops()
    counts = {op: n - before.get(op, 0) for op, n in after.items() if n - before.get(op, 0) > 0}
    print(f"extra-copy ops over {args.steps} training steps:")
    for op, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(f"  {op:60s} {n:6d}")


if __name__ == "__main__":
    main()
