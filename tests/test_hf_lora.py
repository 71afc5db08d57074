"""LoRA fine-tuning with PEFT on vnpu: parity with CPU, state on the device, adapter loads on CPU."""
import os
import sys

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
finetune_lora = pytest.importorskip("finetune_lora", reason="examples/finetune_lora.py needs peft")


def test_lora_on_vnpu_matches_cpu_and_adapter_loads_on_cpu(tmp_path):
    from peft import PeftModel
    from transformers import AutoModel

    summary = finetune_lora.main(["--compare", "--steps", "4", "--batch-size", "8", "--out", str(tmp_path), "--quiet"])
    cpu, vnpu = summary["runs"]
    assert vnpu["param_devices"] == ["vnpu"]  # parameters and optimizer state live on vnpu, no silent CPU
    for a, b in zip(cpu["train"], vnpu["train"]):
        assert abs(a - b) <= 1e-4 * abs(a)
    assert vnpu["train"][-1] < vnpu["train"][0]

    base = AutoModel.from_pretrained(finetune_lora.get_model_path())
    loaded = PeftModel.from_pretrained(base, str(tmp_path / "vnpu" / "adapter"))  # saved on vnpu, loaded on cpu
    lora_b = [p for n, p in loaded.named_parameters() if "lora_B" in n]
    assert lora_b and all(p.device.type == "cpu" for p in lora_b)
    assert any(p.abs().sum() > 0 for p in lora_b)  # trained (lora_B starts at zero)
