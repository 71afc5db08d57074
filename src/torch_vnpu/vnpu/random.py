"""vnpu random number generation (mirrors ``torch.cuda.random``).

Each device has a default ``torch.Generator`` with a Philox-style state of
16 bytes (seed: uint64, offset: uint64, little endian; a ``torch.uint8`` CPU
tensor). ``torch.manual_seed`` seeds every vnpu device too.

Initialization follows ``torch.cuda``: the seeding and state-setting functions
(``manual_seed*``, ``seed*``, ``set_rng_state*``) do not initialize the device
(torch.cuda queues them until the first use; vnpu's generators need no device
context, so they apply at once), while ``get_rng_state*`` and ``initial_seed``
initialize it, as on CUDA. A device index outside ``[0, device_count())``
raises the usual invalid-device RuntimeError everywhere.
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


def _index(device) -> int:
    """Index of ``device`` (None / "vnpu": the current device) without initializing the device;
    raises ValueError for another device type and the usual RuntimeError for an invalid index."""
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "vnpu":
            raise ValueError(f"Expected a vnpu device, but got: {device}")
        device = device.index
    index = int(_C._current_device()) if device is None else int(device)
    _C._check_device_index(index)
    return index


def _gen(device) -> torch.Generator:
    return _generators()[_index(device)]


def get_rng_state(device="vnpu") -> torch.Tensor:
    """The generator state of ``device`` as a ``torch.uint8`` CPU tensor of 16 bytes (seed, offset).
    Initializes the device, as ``torch.cuda.get_rng_state``."""
    from . import _lazy_init

    _lazy_init()
    return _gen(device).get_state()


def get_rng_state_all() -> List[torch.Tensor]:
    """``get_rng_state(i)`` for every device."""
    return [get_rng_state(i) for i in range(len(_generators()))]


def set_rng_state(new_state: torch.Tensor, device="vnpu") -> None:
    """Restores a state from ``get_rng_state`` on ``device``.

    As on CUDA, ``new_state`` must be a contiguous CPU ``torch.ByteTensor`` (TypeError otherwise, e.g. for
    a vnpu tensor; RuntimeError if it is not contiguous) of 16 bytes whose offset is a multiple of 4
    (RuntimeError). Everything is checked before anything changes: a call that raises leaves the
    generator as it was.
    """
    _gen(device).set_state(new_state)


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    """Sets the state of device ``i`` to ``new_states[i]``. Every state is validated (as by
    ``set_rng_state``) before any generator changes; more states than devices raise the invalid-device
    error."""
    states = list(new_states)
    gens = _generators()
    if len(states) > len(gens):
        _C._check_device_index(len(gens))
    if not states:
        return
    scratch = torch.Generator(device="vnpu")  # the generators' own checks, on a generator nobody uses
    for state in states:
        scratch.set_state(state)
    for gen, state in zip(gens, states):
        gen.set_state(state)


def manual_seed(seed: int) -> None:
    """Seeds the current device's generator. Does not initialize the device."""
    seed = int(seed)
    if _generators():
        _gen(None).manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    """Seeds every device's generator (``torch.manual_seed`` calls this). Does not initialize the device."""
    seed = int(seed)
    for g in _generators():
        g.manual_seed(seed)


def seed() -> None:
    """Seeds the current device with a non-deterministic random number."""
    if _generators():
        _gen(None).seed()


def seed_all() -> None:
    """Seeds every device with one non-deterministic random number."""
    gens = _generators()
    if gens:
        s = gens[0].seed()
        for g in gens[1:]:
            g.manual_seed(s)


def initial_seed() -> int:
    """The seed of the current device's generator. Initializes the device, as ``torch.cuda.initial_seed``."""
    from . import _lazy_init

    _lazy_init()
    return _gen(None).initial_seed()
