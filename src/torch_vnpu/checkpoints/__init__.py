"""Checkpoint I/O at storage speed: files read straight into vnpu memory, saved through pinned buffers.

:func:`torch_vnpu.checkpoints.safetensors.load_file` loads a safetensors file onto vnpu with the device's file reads,
several in flight (Note [Checkpoint reads], csrc/io/FileRead.cpp); ``safetensors.torch.load_file(path, device="vnpu")``
uses it through the Hugging Face adapter.
"""
