"""Adapters that make third-party libraries use the current accelerator (vnpu).

They switch themselves on: ``import torch`` (which loads torch_vnpu) installs an import hook
(``_autoload``) and nothing else; when a library an adapter patches is first imported, the adapter patches it
(each patch is logged once at debug level on the ``torch_vnpu.integrations`` logger). A library version the
adapter was not tested with is left alone, with one warning naming the version.

``VNPU_INTEGRATIONS=0`` switches every adapter off, ``VNPU_INTEGRATIONS=-huggingface`` one of them,
``VNPU_INTEGRATIONS=huggingface`` keeps only the named ones (comma-separated).

``torch_vnpu.integrations.huggingface``: accelerate / transformers / peft device selection, safetensors device
strings (``docs/huggingface.md``).
``torch_vnpu.integrations.lightning``: PyTorch Lightning and Fabric, ``accelerator="vnpu"`` / ``"auto"``
(``docs/porting.md``, "PyTorch Lightning").
"""
