"""The Hugging Face sweep's `--compile` mode on one architecture (the sweep itself: `scripts/hf_coverage.py
--compile`, results in docs/hf_coverage.md): GPT-2 as a tiny random-weight model, compiled on vnpu
(`model.compile()`: forward, AOTAutograd backward and the forwards of `generate()`), against eager CPU at the
sweep's tolerances (logits atol=rtol=1e-4, gradients norm-relative 1e-4, greedy tokens equal); then greedy
`generate(cache_implementation="static")` with its decode forward compiled by transformers' auto-compilation,
tokens equal to eager CPU's."""
import importlib.util
import os

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
pytest.importorskip("transformers")

_SRC = os.path.join(os.path.dirname(__file__), "..", "src", "torch_vnpu", "testing", "hf_coverage.py")
_spec = importlib.util.spec_from_file_location("hf_coverage_compile_under_test", _SRC)
hf_coverage = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hf_coverage)


@pytest.mark.slow
def test_gpt2_compiled_on_vnpu_matches_eager_cpu():
    import torch

    try:
        r = hf_coverage.run_arch("gpt2", compile=True)
    finally:
        torch._dynamo.reset()
    assert r["status"] == "pass", f"{r['status']} at {r['stage']}: {r['error']}\n" + "\n".join(r["details"])
    assert r["stage"] == "done" and not r["notes"], r["notes"]  # forward, backward and generate all ran
    # The forward (with its backward) and generate's prefill and decode steps: several graphs, not one per token.
    assert 2 <= r["compiled_graphs"] <= 6, r["compiled_graphs"]
    # Static cache: fixed shapes, so the decode steps reuse one graph (plus the prefill's, if compiled).
    assert r["static_cache"] == "pass" and 1 <= r["static_cache_graphs"] <= 3, r
