"""The worker pool of the project pass: every job runs once, on the worker it names (a file is
summarised and checked by the same process), whatever order the jobs come in and however
late they are made."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from bnfix.project.workers import CHUNK, InProcess, Processes


class Echo:
    def where(self, job: int) -> tuple[int, int]:
        return job, os.getpid()


@pytest.mark.parametrize("assign", [
    lambda job: job % 3,  # round robin
    lambda job: 0,  # every job on one worker: the others stay idle
    lambda job: 2 if job < 3 * CHUNK else 1,  # a long run for one worker, then another's
], ids=["round-robin", "one-worker", "runs"])
def test_every_job_runs_once_on_its_worker(assign) -> None:
    made: list[int] = []

    def jobs() -> Iterator[tuple[int, tuple[int]]]:
        for job in range(5 * CHUNK + 3):
            made.append(job)
            yield assign(job), (job,)

    pool = Processes(3, Echo)
    try:
        # worker i's process, by job (results come back in the order they finish)
        pids = dict(pool.run("where", [(i, (i,)) for i in range(3)]))
        results = list(pool.run("where", jobs()))
    finally:
        pool.close()
    assert sorted(job for job, _ in results) == list(range(5 * CHUNK + 3)) == made
    for job, pid in results:
        assert pid == pids[assign(job)]


def test_jobs_are_made_as_the_workers_need_them() -> None:
    """A generator of jobs is drawn lazily: results come back before the last job is made."""
    made: list[int] = []

    def jobs() -> Iterator[tuple[int, tuple[int]]]:
        for job in range(20 * CHUNK):
            made.append(job)
            yield job % 2, (job,)

    pool = Processes(2, Echo)
    try:
        stream = pool.run("where", jobs())
        next(stream)
        assert len(made) < 20 * CHUNK
        assert len(list(stream)) == 20 * CHUNK - 1
    finally:
        pool.close()


def test_no_jobs_and_in_process() -> None:
    pool = Processes(2, Echo)
    try:
        assert list(pool.run("where", iter(()))) == []
    finally:
        pool.close()
    assert [job for job, _ in InProcess(Echo).run("where", ((0, (j,)) for j in range(3)))] == \
        [0, 1, 2]


def test_files_are_spread_over_the_workers_by_size(tmp_path) -> None:
    """Largest first, each to the least loaded worker: no worker ends with more than another
    one's bytes plus one file's, whatever the paths hash to (two large files whose paths sent
    them to one worker made it the run's critical path)."""
    import random

    from bnfix.project.modules import ModuleRef
    from bnfix.project.runner import Plan, _balance

    rng = random.Random(7)
    plans = []
    for i in range(60):
        path = tmp_path / f"m{i}.py"
        big = rng.choice([50_000, 80_000]) if i < 4 else rng.randrange(1, 5_000)
        path.write_bytes(b"#" * big)
        plans.append(Plan(str(path), str(path), ModuleRef(f"m{i}", f"m{i}", False), True,
                          frozenset(), "", worker=0))
    plans.append(Plan("gone.py", str(tmp_path / "gone.py"), ModuleRef("gone", "gone", False),
                      True, frozenset(), "", worker=0))  # unreadable: weighs nothing
    for size in (2, 3):
        _balance(plans, size)
        loads = [sum(os.path.getsize(p.absolute) for p in plans
                     if p.worker == w and os.path.exists(p.absolute)) for w in range(size)]
        largest = max(os.path.getsize(p.absolute) for p in plans if os.path.exists(p.absolute))
        assert {p.worker for p in plans} == set(range(size))
        assert max(loads) - min(loads) <= largest
        assert max(loads) <= sum(loads) / size + largest
