"""Opt-in adapters that make third-party libraries use the current accelerator (vnpu).

Nothing here is imported by ``import torch`` or ``import torch_vnpu``; each adapter is enabled explicitly.

``torch_vnpu.integrations.huggingface``: Hugging Face accelerate / transformers / peft device selection
(see ``docs/huggingface.md``).
"""
