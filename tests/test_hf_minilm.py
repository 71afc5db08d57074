"""A real pretrained model (all-MiniLM-L6-v2, bundled offline) on vnpu matches CPU."""
import os
import sys

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
embeddings = pytest.importorskip("embeddings", reason="examples/embeddings.py needs transformers")


def test_minilm_embeddings_match_cpu():
    cos = embeddings.main(["--device", "vnpu"])
    assert cos.shape == (len(embeddings.SENTENCES),)
    assert bool((cos >= 0.99999).all()), cos


def test_minilm_backward_on_vnpu_matches_cpu():
    from transformers import AutoModel, AutoTokenizer

    path = embeddings.get_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    batch = tok(embeddings.SENTENCES[:2], padding=True, return_tensors="pt")
    grads = {}
    for dev in ("cpu", "vnpu"):
        model = AutoModel.from_pretrained(path).to(dev)
        out = model(**batch.to(dev)).last_hidden_state
        out.pow(2).mean().backward()
        grads[dev] = model.embeddings.word_embeddings.weight.grad.cpu()
        assert model.embeddings.word_embeddings.weight.grad.device.type == dev
    torch.testing.assert_close(grads["vnpu"], grads["cpu"], rtol=1e-4, atol=1e-6)
