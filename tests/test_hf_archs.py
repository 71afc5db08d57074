"""A representative slice of the Hugging Face causal-LM architecture sweep (issue #4; the full sweep is
`make hf-coverage`, report in docs/hf_coverage.md): tiny random-weight models of a dozen families, built
with the same seed, run on CPU and on vnpu through src/torch_vnpu/testing/hf_coverage.py. Each must match CPU:
forward logits (float32, atol=rtol=1e-4), every parameter's gradient (norm-relative), and greedy
`generate()` of 8 new tokens with the KV cache (same tokens)."""
import importlib.util
import os

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
pytest.importorskip("transformers")

_SRC = os.path.join(os.path.dirname(__file__), "..", "src", "torch_vnpu", "testing", "hf_coverage.py")
_spec = importlib.util.spec_from_file_location("hf_coverage_under_test", _SRC)
hf_coverage = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hf_coverage)

ARCHS = [
    "llama", "gpt2", "qwen2", "mistral", "phi",          # dense decoders (rotary, learned positions, partial rotary)
    "mixtral", "qwen2_moe",                              # mixture of experts (grouped experts, shared expert)
    "mamba", "jamba",                                    # state-space / hybrid attention + mamba + MoE
    "bert",                                              # encoder used as a decoder (BertLMHeadModel)
    "gemma3",                                            # multimodal model, text path (sliding + global layers)
    "gpt_neox",
]


@pytest.mark.parametrize("arch", ARCHS)
def test_arch_matches_cpu(arch):
    r = hf_coverage.run_arch(arch)
    assert r["status"] == "pass", f"{arch}: {r['status']} at {r['stage']}: {r['error']}\n" + "\n".join(r["details"])
    assert r["stage"] == "done"
    # all three checks ran: forward + backward always; generate unless CPU itself cannot generate
    assert not any(n.startswith("generate skipped") for n in r["notes"]), r["notes"]
    assert 0 < r["params"] < 5_000_000
    assert r["fallback_ops"] == {}, r["fallback_ops"]


def test_harness_detects_a_mismatch():
    """The comparison is not vacuous: perturbed gradients and different tokens are reported."""
    import torch

    g = {"w": torch.ones(4, 4)}
    assert hf_coverage.compare_grads(g, {"w": torch.ones(4, 4)}) == []
    assert hf_coverage.compare_grads(g, {"w": torch.ones(4, 4) * 1.01})
    assert hf_coverage.compare_grads(g, {"w": None})
    # Compiled: a zero gradient where eager gives None is AOTAutograd's (noted), any other value is not.
    notes = []
    assert hf_coverage.compare_grads({"w": None}, {"w": torch.zeros(4, 4)}, compiled=True, notes=notes) == []
    assert notes and "131794" in notes[0]
    assert hf_coverage.compare_grads({"w": None}, {"w": torch.zeros(4, 4)})
    assert hf_coverage.compare_grads({"w": None}, {"w": torch.full((4, 4), 1e-3)}, compiled=True)
    toks = torch.tensor([[5, 6, 7]])
    logits = [torch.tensor([[0.0] * 10]).index_fill(1, torch.tensor([5]), 3.0)] * 3
    assert hf_coverage.compare_generate(toks, logits, toks.clone())[0]
    ok, note = hf_coverage.compare_generate(toks, logits, torch.tensor([[4, 6, 7]]))
    assert not ok and "step 0" in note


def test_compiled_mismatch_is_judged_against_the_model_compiled_on_cpu():
    """--compile: a mismatch against eager CPU that compiled CPU shows too is Inductor's numerics (noted); one
    that compiled CPU does not show stays a mismatch."""
    import torch

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(16, 8)
            self.out = torch.nn.Linear(8, 16)

        def forward(self, input_ids, attention_mask=None, use_cache=False):
            return self.out(torch.tanh(self.emb(input_ids)))

    torch.manual_seed(0)
    model = Tiny()
    ids = torch.randint(0, 16, (2, 5))
    w = torch.randn(2, 5, 16)
    ref_logits, ref_grads = hf_coverage._forward_backward(model, ids, w)
    notes = []
    assert hf_coverage._against_compiled_cpu(model, ids, w, ref_logits, ref_grads, ["grad x: made up"], notes) == []
    assert "Inductor's numerics" in notes[0] and "grad x: made up" in notes[0]
    wrong = {n: g * 1.01 for n, g in ref_grads.items()}
    bad = hf_coverage._against_compiled_cpu(model, ids, w, ref_logits, wrong, ["grad x: made up"], [], ref_grads)
    assert bad[0] == "grad x: made up" and any("against compiled CPU too: grad" in b for b in bad[1:])


def test_shrunk_configs_keep_every_layer_kind():
    """Trimming a hybrid model to a few layers keeps one layer of each kind (here: sliding and full attention)."""
    cfg = hf_coverage.shrink_config("gemma3_text")
    assert set(cfg.layer_types) == {"sliding_attention", "full_attention"}
    assert cfg.num_hidden_layers == len(cfg.layer_types) <= 3
    assert cfg.hidden_size == hf_coverage.HIDDEN and cfg.vocab_size == hf_coverage.VOCAB


def test_histc_of_integer_tensors_as_on_cuda():
    """transformers' grouped-MoE routing calls histc on int32 expert ids on every non-CPU device (CUDA accepts
    integer inputs; ATen's CPU kernel does not): vnpu counts them exactly, in the input's dtype."""
    import torch

    ids = torch.tensor([0, 3, 1, 1, 3, 3, 2, 7, -1], dtype=torch.int32)
    for dt in (torch.int32, torch.int64, torch.uint8):
        x = ids.clamp(min=0).to(dt) if dt == torch.uint8 else ids.to(dt)
        got = torch.histc(x.to("vnpu"), bins=4, min=0, max=3)
        assert got.device.type == "vnpu" and got.dtype == dt
        assert torch.equal(got.cpu(), torch.histc(x.double(), bins=4, min=0, max=3).to(dt))
    out = torch.empty(0, dtype=torch.int32, device="vnpu")
    torch.histc(ids.to("vnpu"), bins=8, out=out)  # min = max = 0: the data's range
    assert torch.equal(out.cpu(), torch.histc(ids.double(), bins=8).int())
    f = torch.randn(100)
    assert torch.equal(torch.histc(f.to("vnpu"), bins=5).cpu(), torch.histc(f, bins=5))


def test_compile_report_is_a_section_of_its_own(tmp_path):
    """`--compile` writes its section into the eager report and replaces only that; an eager run keeps it."""
    def result(compile, status):
        meta = {"torch": "t", "transformers": "x", "started": "now", "duration_s": 60, "jobs": 1, "timeout": 1,
                "command": "cmd", "compile": compile}
        return {"meta": meta, "archs": {"gpt2": {"arch": "gpt2", "status": status, "error": "", "notes": [],
                                                 "seconds": 1, "compiled_graphs": 3}}}

    path = str(tmp_path / "report.md")
    hf_coverage.write_markdown(result(False, "pass"), path)
    eager = open(path).read()
    hf_coverage.write_markdown(result(True, "mismatch"), path)
    text = open(path).read()
    assert text.startswith(eager.rstrip("\n")) and "**0 / 1** of the architectures run pass compiled" in text
    hf_coverage.write_markdown(result(True, "pass"), path)
    text = open(path).read()
    assert text.count("## torch.compile (`--compile`)") == 1 and "**1 / 1**" in text and "| `gpt2` | pass | 3 |" in text
    hf_coverage.write_markdown(result(False, "vnpu_error"), path)
    text = open(path).read()
    assert "**0 / 1** architectures that run on CPU pass on vnpu" in text and "**1 / 1** of the architectures" in text
