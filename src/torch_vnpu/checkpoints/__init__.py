"""Checkpoint I/O at storage speed: files streamed into vnpu memory through pinned staging buffers.

:func:`torch_vnpu.checkpoints.safetensors.load_file` loads a safetensors file onto vnpu with reads and uploads overlapped
(Note [Staged file reads], csrc/io/StagedFileRead.cpp); ``safetensors.torch.load_file(path, device="vnpu")``
uses it through the Hugging Face adapter.
"""
