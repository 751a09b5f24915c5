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
