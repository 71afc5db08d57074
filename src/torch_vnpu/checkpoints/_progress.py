"""A progress bar for checkpoint reads and writes: tqdm's, shown only when the transfer lasts over a second and
stderr is a terminal (tqdm's own rules: ``delay``, ``disable=None``, ``TQDM_DISABLE``); none without tqdm."""

from __future__ import annotations

import os


class _Bar:
    """Counts bytes for one transfer; ``callback`` takes the bytes done so far (what csrc/io reports)."""

    def __init__(self, total: int, desc: str):
        self._done = 0
        self._tqdm = None
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return
        self._tqdm = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, delay=1.0,
                          disable=None, leave=False)

    def callback(self, done: int) -> None:
        if self._tqdm is not None and done > self._done:
            self._tqdm.update(done - self._done)
        self._done = max(self._done, done)

    def advance(self, n: int) -> None:
        self.callback(self._done + n)

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def bar(total: int, verb: str, path: str | os.PathLike) -> _Bar:
    """A bar for ``total`` bytes, labelled e.g. "Loading model.safetensors"."""
    return _Bar(total, f"{verb} {os.path.basename(os.fspath(path))}")
