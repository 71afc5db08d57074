"""Multi-process test harness for torch.distributed on vnpu.

``ProcessWorld(n)`` starts ``n`` processes once (spawn), sets the environment torchrun would set
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), selects ``vnpu:<rank>``
and calls ``torch.distributed.init_process_group()``; ``world.run(fn, *args)`` then calls
``fn(rank, world_size, *args)`` on every rank and returns the per-rank results, so one set of
processes serves a whole test module. ``fn`` must be a module-level function of an importable file
(test files are loaded by path). A failure on any rank raises ``RankFailure`` with every failing
rank's traceback; a rank that does not answer within the timeout raises ``TimeoutError`` and the
world is torn down (never a hang). ``run_world(n, fn, ...)`` runs one function in a fresh world
(for tests that break their group on purpose).

Example::

    @pytest.fixture(scope="module")
    def world():
        with ProcessWorld(2) as w:
            yield w

    def _sum(rank, world_size):
        x = torch.full((4,), float(rank), device="vnpu")
        dist.all_reduce(x)
        return x.cpu()

    def test_sum(world):
        for r in world.run(_sum):
            assert r.tolist() == [1.0] * 4
"""

from __future__ import annotations

import datetime
import importlib.util
import multiprocessing as mp
import os
import queue
import socket
import sys
import time
import traceback
from typing import Any, Callable

__all__ = ["ProcessWorld", "RankFailure", "free_port", "run_world"]


class RankFailure(AssertionError):
    """A test function raised on one or more ranks (message: each failing rank's traceback)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_loaded: dict[str, Any] = {}


def _resolve(path: str, name: str) -> Callable:
    mod = _loaded.get(path)
    if mod is None:
        spec = importlib.util.spec_from_file_location(f"_vnpu_dist_test_{len(_loaded)}", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        _loaded[path] = mod
    return getattr(mod, name)


def _worker(rank, world_size, port, env, init, init_kwargs, bind_device, tasks, results):
    os.environ.update(env)
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )
    try:
        import torch
        import torch.distributed as dist

        device = rank % torch.vnpu.device_count()
        torch.vnpu.set_device(device)
        if init:
            kwargs = dict(init_kwargs)
            kwargs.setdefault("timeout", datetime.timedelta(seconds=60))
            if bind_device:
                kwargs["device_id"] = torch.device("vnpu", device)
            dist.init_process_group(**kwargs)
        results.put((rank, "ready", None))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
        return
    while True:
        task = tasks.get()
        if task is None:
            break
        path, name, args = task
        try:
            out = _resolve(path, name)(rank, world_size, *args)
            results.put((rank, "ok", out))
        except BaseException:
            results.put((rank, "error", traceback.format_exc()))
    try:
        if init and dist.is_initialized():
            dist.destroy_process_group()
    except BaseException:
        pass


class ProcessWorld:
    """``world_size`` spawned processes forming one torch.distributed world (see the module doc).

    Args:
        world_size: number of ranks (processes).
        env: extra environment variables for the workers (e.g. ``{"VNPU_DEVICE_COUNT": "4"}``).
        init: call ``init_process_group(**init_kwargs)`` in each worker (default: no backend named).
        bind_device: also pass ``device_id=vnpu:<rank>`` (needed by ``split_group``).
        timeout: seconds to wait for a start-up or a ``run`` before tearing the world down.
    """

    def __init__(self, world_size: int, env: dict | None = None, init: bool = True,
                 init_kwargs: dict | None = None, bind_device: bool = False, timeout: float = 120.0):
        self.world_size = world_size
        self.timeout = timeout
        self.port = free_port()
        env = dict(env or {})
        env.setdefault("VNPU_DEVICE_COUNT", str(max(2, world_size)))
        env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun sets it
        ctx = mp.get_context("spawn")
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(world_size)]
        self._procs = [
            ctx.Process(target=_worker, daemon=True,
                        args=(r, world_size, self.port, env, init, init_kwargs or {}, bind_device, self._tasks[r],
                              self._results))
            for r in range(world_size)
        ]
        # The environment must be set when the interpreters start (torch.distributed reads
        # TORCH_DISTRIBUTED_DEBUG at import): spawn copies the parent's.
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            for p in self._procs:
                p.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self._collect("ready", timeout)

    def _collect(self, what: str, timeout: float) -> list:
        out: list = [None] * self.world_size
        errors: dict[int, str] = {}
        pending = set(range(self.world_size))
        deadline = time.monotonic() + timeout
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close(kill=True)
                raise TimeoutError(f"ranks {sorted(pending)} did not answer ({what}) within {timeout:.0f} s")
            try:
                rank, status, value = self._results.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [r for r in pending if not self._procs[r].is_alive()]
                if dead:
                    self.close(kill=True)
                    raise RankFailure(f"ranks {dead} exited (exit codes "
                                      f"{[self._procs[r].exitcode for r in dead]}) during {what}")
                continue
            pending.discard(rank)
            if status == "error":
                errors[rank] = value
            else:
                out[rank] = value
        if errors:
            msg = "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in sorted(errors.items()))
            if what == "ready":
                self.close(kill=True)
            raise RankFailure(f"{what} failed on ranks {sorted(errors)}:\n{msg}")
        return out

    def run(self, fn: Callable, *args, timeout: float | None = None) -> list:
        """Calls ``fn(rank, world_size, *args)`` on every rank; returns the results by rank."""
        path = os.path.abspath(fn.__code__.co_filename)
        for q in self._tasks:
            q.put((path, fn.__name__, args))
        return self._collect(fn.__name__, timeout or self.timeout)

    def close(self, kill: bool = False) -> None:
        """Stops the workers (kill=True: at once)."""
        for p, q in zip(self._procs, self._tasks):
            if p.is_alive() and not kill:
                q.put(None)
        for p in self._procs:
            if not kill:
                p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)

    def __enter__(self) -> "ProcessWorld":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_world(world_size: int, fn: Callable, *args, env: dict | None = None, init: bool = True,
              init_kwargs: dict | None = None, bind_device: bool = False, timeout: float = 120.0) -> list:
    """Runs ``fn`` once in a fresh world of ``world_size`` processes and tears it down."""
    with ProcessWorld(world_size, env=env, init=init, init_kwargs=init_kwargs, bind_device=bind_device,
                      timeout=timeout) as w:
        return w.run(fn, *args)
