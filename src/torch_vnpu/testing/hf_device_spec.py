"""Device spec that runs the Hugging Face transformers and diffusers test suites on vnpu.

transformers (``TRANSFORMERS_TEST_DEVICE_SPEC``, read by ``transformers/testing_utils.py``) and diffusers
(``DIFFUSERS_TEST_DEVICE_SPEC``, ``diffusers/utils/testing_utils.py``) import this file by name and map
``DEVICE_NAME`` to the functions below in their ``BACKEND_*`` dispatch tables (``backend_manual_seed``,
``backend_empty_cache``, ``backend_device_count``, ...). Both import it with
``importlib.import_module(path[:path.index(".py")])``, so pass a bare file name in the working directory
(copy or symlink this file there); see ``docs/huggingface.md``.

Names read by transformers 5.17: ``DEVICE_NAME``, ``MANUAL_SEED_FN``, ``EMPTY_CACHE_FN``, ``DEVICE_COUNT_FN``.
diffusers 0.42 additionally reads ``SUPPORTS_TRAINING``, ``RESET_PEAK_MEMORY_STATS_FN``,
``RESET_MAX_MEMORY_ALLOCATED_FN`` and ``MAX_MEMORY_ALLOCATED_FN``. ``MEMORY_ALLOCATED_FN`` and
``SYNCHRONIZE_FN`` are provided for the other ``BACKEND_*`` tables and for harnesses that read them.
"""

import torch  # loads torch_vnpu (torch.backends entry point), which installs torch.vnpu

DEVICE_NAME = "vnpu"

MANUAL_SEED_FN = torch.vnpu.manual_seed  # (seed: int) -> None, seeds the current vnpu device
EMPTY_CACHE_FN = torch.vnpu.empty_cache  # () -> None, releases unused cached device memory
DEVICE_COUNT_FN = torch.vnpu.device_count  # () -> int, visible vnpu devices
SUPPORTS_TRAINING = True  # a flag, not a function: backward passes and optimizers run on vnpu
RESET_PEAK_MEMORY_STATS_FN = torch.vnpu.reset_peak_memory_stats  # (device=None) -> None
RESET_MAX_MEMORY_ALLOCATED_FN = torch.vnpu.reset_max_memory_allocated  # (device=None) -> None
MAX_MEMORY_ALLOCATED_FN = torch.vnpu.max_memory_allocated  # (device=None) -> int bytes
MEMORY_ALLOCATED_FN = torch.vnpu.memory_allocated  # (device=None) -> int bytes
SYNCHRONIZE_FN = torch.vnpu.synchronize  # (device=None) -> None, waits for all streams of the device
