"""vnpu random number generation (mirrors ``torch.cuda.random``).

Each device has a default ``torch.Generator`` with a Philox-style state of
16 bytes (seed: uint64, offset: uint64). ``torch.manual_seed`` seeds every
vnpu device too.
"""

from typing import Iterable, List

import torch

from .. import _C

_default_generators: tuple = ()


def _generators() -> tuple:
    global _default_generators
    if not _default_generators:
        from . import device_count

        _default_generators = tuple(_C._default_generator(i) for i in range(device_count()))
    return _default_generators


class _DefaultGenerators(tuple):
    """Lazily built tuple of the per-device default generators."""

    def __new__(cls):
        return super().__new__(cls)

    def __getitem__(self, i):
        return _generators()[i]

    def __len__(self):
        return len(_generators())

    def __iter__(self):
        return iter(_generators())


default_generators = _DefaultGenerators()


def _gen(device) -> torch.Generator:
    from . import _get_device_index

    return _generators()[_get_device_index(device)]


def get_rng_state(device="vnpu") -> torch.Tensor:
    """The generator state of ``device`` as a uint8 CPU tensor of 16 bytes (seed, offset)."""
    return _gen(device).get_state()


def get_rng_state_all() -> List[torch.Tensor]:
    return [g.get_state() for g in _generators()]


def set_rng_state(new_state: torch.Tensor, device="vnpu") -> None:
    """Restores a state from ``get_rng_state``; raises RuntimeError if it is not 16 bytes."""
    _gen(device).set_state(new_state.clone(memory_format=torch.contiguous_format))


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def manual_seed(seed: int) -> None:
    """Seeds the current device's generator."""
    _gen(None).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seeds every device's generator (``torch.manual_seed`` calls this)."""
    for g in _generators():
        g.manual_seed(int(seed))


def seed() -> None:
    """Seeds the current device with a non-deterministic random number."""
    _gen(None).seed()


def seed_all() -> None:
    s = _gen(None).seed()
    for g in _generators():
        g.manual_seed(s)


def initial_seed() -> int:
    """The seed of the current device's generator."""
    return _gen(None).initial_seed()
