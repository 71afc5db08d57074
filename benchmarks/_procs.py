"""Helpers shared by the benchmarks that run each device in a process of its own."""

import multiprocessing


def receive(conn, proc):
    """The child's next message; raises if the child died instead of answering (never waits forever)."""
    while not conn.poll(1.0):
        if not proc.is_alive():
            raise RuntimeError(f"benchmark process {proc.name} exited with code {proc.exitcode}; see its traceback above")
    return conn.recv()


def run_in_process(target, *args):
    """``target(*args, conn)`` in a fresh (spawned) process; returns the one message it sends."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(*args, child), daemon=True, name=target.__name__)
    proc.start()
    result = receive(parent, proc)
    proc.join()
    return result


def start_processes(names, target, args_of):
    """For each name, a spawned process running ``target(*args_of(name), conn)`` whose first message ("ready") has
    arrived; returns ({name: process}, {name: connection})."""
    ctx = multiprocessing.get_context("spawn")
    procs, conns = {}, {}
    for name in names:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=target, args=(*args_of(name), child), daemon=True, name=name)
        proc.start()
        receive(parent, proc)
        print(f"[{name}] ready", flush=True)
        procs[name], conns[name] = proc, parent
    return procs, conns


def alternate_rounds(procs, conns, rounds):
    """Runs ``rounds`` rounds, each sending "round" to every process in turn (so drift hits all alike) and waiting
    for its answer; then sends "stop" and returns {name: final message}, the processes joined."""
    for r in range(rounds):
        for name in procs:
            conns[name].send("round")
            receive(conns[name], procs[name])
        print(f"round {r + 1}/{rounds} done", flush=True)
    results = {}
    for name in procs:
        conns[name].send("stop")
        results[name] = receive(conns[name], procs[name])
        procs[name].join()
    return results
