"""transformers Trainer and TRL SFTTrainer on vnpu (through torch_vnpu.integrations.huggingface), against CPU.

Tiny random-init Llama models built from a config; data from in-memory Python lists; nothing is downloaded.
"""
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
from accelerate.state import AcceleratorState  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments  # noqa: E402

import torch_vnpu.integrations.huggingface as hf_vnpu  # noqa: E402

# Same ATen CPU kernels on both devices: losses have been bitwise equal; the assertion allows 1e-5 relative.
RTOL = 1e-5


def _tiny_llama(vocab_size: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def _losses(trainer) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def _assert_on_vnpu(trainer):
    assert trainer.args.device.type == "vnpu" and trainer.accelerator.device.type == "vnpu"
    assert {p.device.type for p in trainer.model.parameters()} == {"vnpu"}
    state = [t for s in trainer.optimizer.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
    assert state and {t.device.type for t in state} == {"vnpu"}  # AdamW exp_avg / exp_avg_sq


class _TokenDataset(torch.utils.data.Dataset):
    """Counting sequences (next token = previous + 1 mod vocab) from random starts: learnable in a few steps."""

    def __init__(self, n: int, length: int, vocab: int):
        g = torch.Generator().manual_seed(1)
        self.rows = (torch.randint(0, vocab, (n, 1), generator=g) + torch.arange(length)) % vocab

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def _run_trainer(tmp_path, use_cpu: bool):
    args = TrainingArguments(
        output_dir=str(tmp_path / ("cpu" if use_cpu else "vnpu")), use_cpu=use_cpu, max_steps=4,
        per_device_train_batch_size=4, learning_rate=5e-3, logging_steps=1, save_strategy="no",
        report_to=[], seed=0, dataloader_num_workers=0, disable_tqdm=True,
        # dataloader_pin_memory stays True (the default): batches reach vnpu through pinned host memory
    )
    trainer = Trainer(model=_tiny_llama(64), args=args, train_dataset=_TokenDataset(16, 24, 64))
    trainer.train()
    return trainer


def test_trainer_tiny_llama_matches_cpu(tmp_path, adapter):
    cpu = _run_trainer(tmp_path, use_cpu=True)
    assert cpu.args.device.type == "cpu"
    cpu_losses = _losses(cpu)
    AcceleratorState._reset_state(reset_partial_state=True)
    vnpu = _run_trainer(tmp_path, use_cpu=False)
    _assert_on_vnpu(vnpu)
    losses = _losses(vnpu)
    print("trainer losses cpu", cpu_losses, "vnpu", losses)
    assert len(losses) == len(cpu_losses) == 4
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses), rtol=RTOL, atol=0)
    assert losses[-1] < losses[0]


def _char_tokenizer(texts):
    """A character-level fast tokenizer built in memory with the `tokenizers` library."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<unk>"]
    vocab = {t: i for i, t in enumerate(specials + sorted(set("".join(texts))))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def _run_sft(tmp_path, use_cpu: bool):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    texts = [f"{a} plus {b} is {a + b}." for a in range(6) for b in range(4)]
    tokenizer = _char_tokenizer(texts)
    args = SFTConfig(
        output_dir=str(tmp_path / ("sft-cpu" if use_cpu else "sft-vnpu")), use_cpu=use_cpu, max_steps=3,
        per_device_train_batch_size=4, learning_rate=5e-3, logging_steps=1, save_strategy="no", report_to=[],
        seed=0, max_length=32, bf16=False, fp16=False, disable_tqdm=True, dataloader_num_workers=0,
    )
    trainer = SFTTrainer(
        model=_tiny_llama(len(tokenizer)), args=args, train_dataset=Dataset.from_dict({"text": texts}),
        processing_class=tokenizer,
    )
    trainer.train()
    return trainer


def test_trl_sft_trainer_tiny_llama_matches_cpu(tmp_path, adapter):
    pytest.importorskip("trl")
    cpu_losses = _losses(_run_sft(tmp_path, use_cpu=True))
    AcceleratorState._reset_state(reset_partial_state=True)
    vnpu = _run_sft(tmp_path, use_cpu=False)
    _assert_on_vnpu(vnpu)
    losses = _losses(vnpu)
    print("sft losses cpu", cpu_losses, "vnpu", losses)
    assert len(losses) == len(cpu_losses) == 3
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses), rtol=RTOL, atol=0)


def test_trainer_bf16_mixed_precision_on_vnpu(tmp_path, adapter):
    """TrainingArguments(bf16=True) is accepted for vnpu (patch 5) and the forward runs under autocast on vnpu."""
    args = TrainingArguments(
        output_dir=str(tmp_path / "bf16"), bf16=True, max_steps=2, per_device_train_batch_size=4,
        learning_rate=5e-3, logging_steps=1, save_strategy="no", report_to=[], seed=0, disable_tqdm=True,
    )
    model = _tiny_llama(64)
    dtypes = []
    model.model.layers[0].mlp.down_proj.register_forward_hook(lambda mod, a, out: dtypes.append(out.dtype))
    trainer = Trainer(model=model, args=args, train_dataset=_TokenDataset(16, 24, 64))
    trainer.train()
    _assert_on_vnpu(trainer)
    assert trainer.accelerator.mixed_precision == "bf16" and dtypes and set(dtypes) == {torch.bfloat16}
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}  # master weights stay fp32
    losses = _losses(trainer)
    fp32_cpu = _losses(_run_trainer(tmp_path, use_cpu=True))[:2]  # same model, data and first two lr values
    assert len(losses) == 2 and all(abs(a - b) < 2e-2 * b for a, b in zip(losses, fp32_cpu)), (losses, fp32_cpu)
