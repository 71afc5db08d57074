"""Testing utilities of torch_vnpu (not imported by ``import torch``).

``torch_vnpu.testing.opinfo``: the OpInfo parity sweep (vnpu vs CPU over PyTorch's ``op_db``);
its command line is ``scripts/opinfo_parity.py``.
"""
