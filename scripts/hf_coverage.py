#!/usr/bin/env python
"""Hugging Face causal-LM architecture sweep: every model_type of transformers' causal-LM auto mapping as a tiny
random-weight model on vnpu vs CPU (forward logits, every parameter's gradient, greedy generate with the KV cache).

Examples (run from outside the repository root, e.g. `cd tests`, with the package installed):
  python ../scripts/hf_coverage.py --archs "llama,gpt2,qwen2*" --jobs 1 --json /tmp/hf.json
  python ../scripts/hf_coverage.py --jobs 2 --json ../out/hf_coverage.json --markdown ../docs/hf_coverage.md
  python ../scripts/hf_coverage.py --compile --archs "gpt2,llama" --json /tmp/hf_compile.json --markdown ../docs/hf_coverage.md
  python ../scripts/hf_coverage.py --from-json ../out/hf_coverage.json --markdown ../docs/hf_coverage.md

The implementation is src/torch_vnpu/testing/hf_coverage.py: this checkout's copy when there is one, else the
installed package's (see _load).
"""
import os
import sys


def _load():
    """This checkout's src/torch_vnpu/testing/hf_coverage.py (so the harness being edited is the one that runs),
    else the installed torch_vnpu.testing.hf_coverage. The checkout's module is imported as the top-level
    module `hf_coverage`, which does not shadow the installed torch_vnpu."""
    import torch  # noqa: F401  (loads torch_vnpu through the torch.backends entry point)

    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.abspath(os.path.join(here, "..", "src", "torch_vnpu", "testing"))
    if os.path.exists(os.path.join(src, "hf_coverage.py")):
        sys.path.insert(0, src)
        import hf_coverage
    else:
        from torch_vnpu.testing import hf_coverage
    return hf_coverage


if __name__ == "__main__":
    sys.exit(_load().main())
