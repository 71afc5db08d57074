"""Helpers shared by the benchmarks that run each device in a process of its own."""


def receive(conn, proc):
    """The child's next message; raises if the child died instead of answering (never waits forever)."""
    while not conn.poll(1.0):
        if not proc.is_alive():
            raise RuntimeError(f"benchmark process {proc.name} exited with code {proc.exitcode}; see its traceback above")
    return conn.recv()
