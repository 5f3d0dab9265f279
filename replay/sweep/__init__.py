"""`llm-replay sweep`: one replay per cell of a grid (or a seeded sample) over config keys.

spec.py reads SWEEP.yaml, keys.py checks and sets dotted keys, cells.py builds every cell up front,
backends.py and ray_backend.py run them, store.py keeps --out (resumable) and the results table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from replay.sweep.cells import Cell, build_cells
from replay.sweep.spec import SweepSpec, read_spec
from replay.sweep import store

__all__ = ["Cell", "SweepSpec", "SweepResult", "build_cells", "read_spec", "run_cells"]


@dataclasses.dataclass(frozen=True)
class SweepResult:
    cells: int  # in the sweep
    skipped: int  # done before (same config and trace hash)
    ran: int
    failed: int  # of those that ran
    results: Path


def run_cells(spec: SweepSpec, cells: list[Cell], traces: dict, out: Path, *, backend: str = "local",
              workers: int = 1, address: str | None = None, keep_runs: bool = False,
              plugins: list[str] | None = None,
              progress: Callable[[int], object] | None = None) -> SweepResult:
    """Run every cell not already done in `out`, record each as it finishes, then rebuild the
    results table from the records. `progress(cells_to_run)` returns the per-cell update callback's
    context (replay/sweep/progress.py)."""
    from contextlib import nullcontext

    from replay.sweep.worker import Job

    plugins = list(plugins or [])
    store.write_manifest(out, spec.source, cells)
    todo, seen = [], set()
    for cell in cells:
        if cell.id not in seen and not store.is_done(out, cell, keep_runs):
            todo.append(cell)
        seen.add(cell.id)  # the same config twice in a grid runs once
    jobs = [Job(c.id, c.cfg, c.trace_key, f"{spec.source} (cell {c.index}: {c.label})", keep_runs) for c in todo]
    by_id = {c.id: c for c in todo}
    used = {c.trace_key: traces[c.trace_key] for c in todo}  # only the traces left to replay travel
    failed = 0
    with (progress(len(jobs)) if progress else nullcontext(lambda cell, record: None)) as update:
        for job, record, run in _backend(backend, jobs, used, plugins, workers, address):
            store.save(out, by_id[job.id], record, run)
            failed += record["status"] != "ok"
            update(by_id[job.id], record)
    path = store.write_results(out, store.results_table(out, cells, spec.keys))
    return SweepResult(len(cells), len(cells) - len(todo), len(todo), failed, path)


def _backend(name: str, jobs, traces, plugins, workers: int, address: str | None):
    from replay.sweep import backends

    if not jobs:
        return iter(())
    if name == "ray":
        from replay.sweep.ray_backend import ray_cells

        return ray_cells(jobs, traces, plugins, address, workers)
    if workers == 1 or len(jobs) == 1:
        return backends.in_process(jobs, traces, plugins)
    return backends.local(jobs, traces, plugins, workers)
