"""Where a sweep's cells run. Each backend yields (job, record, run) as cells finish, in any order.

- in-process (one worker): the engine warmed here, no process to start;
- local: worker processes (forkserver: a fresh interpreter per worker, not a fork of a process
  holding numba's and polars' threads), each warmed once, the traces pickled once per worker;
- ray: tasks on a Ray cluster (replay/sweep/ray_backend.py), each trace put in the object store once.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from replay.sweep import worker
from replay.sweep.worker import Job


def in_process(jobs: list[Job], traces: dict, plugins: list[str]) -> Iterator[tuple[Job, dict, Any]]:
    worker.ensure_warm()
    for job in jobs:
        record, run = worker.run_cell(job, traces[job.trace_key])
        yield job, record, run


def local(jobs: list[Job], traces: dict, plugins: list[str], workers: int) -> Iterator[tuple[Job, dict, Any]]:
    """Up to `workers` cells at a time. A worker that dies (killed, out of memory) breaks the pool:
    the cells it had not finished go to a new pool once; a cell in a pool that breaks twice is
    recorded failed (a re-run tries it again), and the sweep goes on."""
    pending, tries = list(jobs), {job.id: 0 for job in jobs}
    while pending:
        context = multiprocessing.get_context("forkserver")
        pool = ProcessPoolExecutor(max_workers=min(workers, len(pending)), mp_context=context,
                                   initializer=worker.init_worker, initargs=(traces, plugins))
        futures = {pool.submit(worker.run_local, job): job for job in pending}
        pending = []
        try:
            while futures:
                done, _ = wait(futures, return_when=FIRST_COMPLETED)
                for future in done:
                    job = futures.pop(future)
                    try:
                        record, run = future.result()
                    except BrokenProcessPool:
                        tries[job.id] += 1
                        if tries[job.id] < 2:
                            pending.append(job)
                            continue
                        record, run = _died(job), None
                    yield job, record, run
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def _died(job: Job) -> dict:
    return {"cell": job.id, "config_sha256": job.cfg.sha256(), "status": "failed", "replay_s": None,
            "error": "a worker process died twice while this cell was queued or running (killed, or out of "
                     "memory); a re-run tries it again"}
