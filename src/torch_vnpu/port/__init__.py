"""Port mode: run scripts written for CUDA on vnpu without editing them.

``import torch_vnpu.port.cuda`` at the top of a script, or ``python -m torch_vnpu.port.run script.py args...``
(see ``torch_vnpu.port.cuda`` and docs/porting.md). ``python -m torch_vnpu.port.check script.py`` lists the
hard-coded CUDA calls of a script with their device-agnostic replacements instead.
"""
