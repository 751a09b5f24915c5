"""Worker processes with affinity: a file is handled by the same process when it is summarised
and when it is checked, so the module lifted for its summary is reused for its findings.

Each process holds a `session.Worker` (an engine and what it lifted). Requests are lists of
calls sent in small chunks, a few outstanding per process, so results stream back and a
Ctrl-C stops everything promptly (the parent handles signals; workers never write files)."""

from __future__ import annotations

import gc
import signal
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # multiprocessing is imported when a pool starts (10 ms of every start-up)
    from multiprocessing.connection import Connection

CHUNK = 8
OUTSTANDING = 2  # chunks in flight per process


def _serve(conn: Connection, make: Callable[[], Any]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    gc.disable()  # a worker lives for one run (see ProjectRunner.run)
    state = make()
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        method, chunk = message
        results = [getattr(state, method)(*args) for args in chunk]
        conn.send(results)


class InProcess:
    """The same interface, run here (small projects: starting processes costs more)."""

    remote = False  # jobs reach the state as they are, not pickled

    def __init__(self, make: Callable[[], Any]) -> None:
        self.state = make()
        self.size = 1

    def run(self, method: str, jobs: Iterable[tuple[int, tuple[Any, ...]]]) -> Iterator[Any]:
        for _, args in jobs:
            yield getattr(self.state, method)(*args)

    def close(self) -> None:
        return

    def terminate(self) -> None:
        return


class Processes:
    remote = True  # each job is pickled to a worker process

    def __init__(self, size: int, make: Callable[[], Any]) -> None:
        import multiprocessing

        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        context = multiprocessing.get_context(method)
        self.size = size
        self.conns: list[Connection] = []
        self.procs = []
        for _ in range(size):
            parent, child = context.Pipe()
            proc = context.Process(target=_serve, args=(child, make), daemon=True)
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)

    def run(self, method: str, jobs: Iterable[tuple[int, tuple[Any, ...]]]) -> Iterator[Any]:
        """Results of `state.method(*args)` for every (worker, args) job, as they arrive. The
        jobs are drawn from `jobs` only as the workers need them (a job may be costly to
        make: the workers run the jobs made before meanwhile)."""
        from multiprocessing.connection import wait

        source = iter(jobs)
        queues: list[list[tuple[Any, ...]]] = [[] for _ in range(self.size)]
        pending = {i: 0 for i in range(self.size)}
        drawn = False  # every job is in a queue

        def draw(i: int) -> None:
            """Draw jobs until worker i has a chunk's worth (or none are left)."""
            nonlocal drawn
            while not drawn and len(queues[i]) < CHUNK:
                try:
                    worker, args = next(source)
                except StopIteration:
                    drawn = True
                    return
                queues[worker % self.size].append(args)

        def feed() -> None:
            for i in range(self.size):
                while pending[i] < OUTSTANDING:
                    draw(i)
                    if not queues[i]:
                        break
                    chunk, queues[i][:] = queues[i][:CHUNK], queues[i][CHUNK:]
                    self.conns[i].send((method, chunk))
                    pending[i] += 1

        feed()
        while any(pending.values()):
            ready = wait([self.conns[i] for i in range(self.size) if pending[i]])
            for conn in ready:
                i = self.conns.index(conn)  # type: ignore[arg-type]
                try:
                    results = conn.recv()  # type: ignore[union-attr]
                except EOFError as exc:
                    raise RuntimeError(f"a bnfix worker process died (exit code "
                                       f"{self.procs[i].exitcode})") from exc
                pending[i] -= 1
                feed()
                yield from results

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()

    def terminate(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.join()
