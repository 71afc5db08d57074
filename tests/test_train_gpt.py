"""The main job (examples/train_gpt.py): cpu/vnpu parity, outputs, checkpoint round trip, no fallbacks."""
import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import train_gpt  # noqa: E402

STEPS = 8


@pytest.fixture(scope="module")
def compare_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpt")
    torch.vnpu.reset_op_stats()
    summary = train_gpt.main(["--compare", "--steps", str(STEPS), "--out", str(out), "--quiet"])
    return out, summary


def test_vnpu_losses_match_cpu_every_step(compare_run):
    out, summary = compare_run
    data = json.loads((out / "losses.json").read_text())
    cpu, vnpu = data["cpu"]["train"], data["vnpu"]["train"]
    assert len(cpu) == len(vnpu) == STEPS
    for a, b in zip(cpu, vnpu):
        assert abs(a - b) <= 1e-5 * abs(a)
    assert cpu[-1] < cpu[0]  # it learns
    assert summary["max_rel_diff"] <= 1e-5


def test_outputs_written_and_no_fallback_ops(compare_run):
    out, summary = compare_run
    assert (out / "loss.png").stat().st_size > 1000
    assert (out / "vnpu" / "losses.json").exists() and (out / "vnpu" / "ckpt.pt").exists()
    assert summary["fallback_ops"] == {}
    assert torch.vnpu.get_fallback_ops() == {}


def test_vnpu_checkpoint_loads_on_cpu_and_resumes_on_vnpu(compare_run, tmp_path):
    out, _ = compare_run
    ckpt = torch.load(out / "vnpu" / "ckpt.pt", map_location="cpu")
    assert all(t.device.type == "cpu" for t in ckpt["model"].values())
    _, _, vocab = train_gpt.load_corpus()
    model = train_gpt.GPT(train_gpt.GPTConfig(vocab_size=len(vocab)))
    model.load_state_dict(ckpt["model"])  # a CPU model takes the vnpu-trained weights
    assert ckpt["step"] == STEPS
    r = train_gpt.main(["--device", "vnpu", "--resume", str(out / "vnpu" / "ckpt.pt"), "--steps", "2",
                        "--out", str(tmp_path), "--quiet"])
    assert r["start_step"] == STEPS and len(r["train"]) == 2
    first = json.loads((out / "vnpu" / "losses.json").read_text())["train"]
    assert r["train"][0] < first[0] - 0.3  # resumed from the trained weights, not from scratch
