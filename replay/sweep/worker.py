"""One cell, one replay: what a worker process (local) or a Ray task runs. The engine is warmed
once per process (numba's kernels load from the on-disk cache every process shares), and a
cell that fails is a record with its error, never an exception that stops the sweep."""

from __future__ import annotations

import dataclasses
import time
import traceback
from typing import Any

# Per process: whether warm_up ran, and the traces a local worker was handed when it started.
_STATE: dict[str, Any] = {"warm": False, "traces": {}}


@dataclasses.dataclass(frozen=True)
class Job:
    """What a worker needs of a cell (the cell's config travels; its trace is shared)."""

    id: str
    cfg: Any  # replay.config.FleetConfig
    trace_key: str
    source: str  # names the cell in messages: the sweep file and its keys
    keep_run: bool  # return the whole run (frames too), for --keep-runs


def init_worker(traces: dict, plugins: list[str]) -> None:
    """A local worker's start: the sweep's traces (pickled once per worker, not per cell), the
    --plugin modules its configs name, then the engine."""
    from policies.plugins import load_plugins

    _STATE["traces"] = traces
    load_plugins(plugins)
    ensure_warm()


def ensure_warm() -> None:
    if not _STATE["warm"]:
        from replay.run import warm_up

        warm_up()
        _STATE["warm"] = True


def run_local(job: Job) -> tuple[dict, Any]:
    return run_cell(job, _STATE["traces"][job.trace_key])


def run_cell(job: Job, trace: Any) -> tuple[dict, Any]:
    """(the cell's record, its RunOutputs or None): status ok with summary.json's content, or
    failed with the error (a fleet that cannot start, a replay that raised)."""
    from common.errors import UserError
    from replay.fleet.cluster import plan_pools
    from replay.run import replay_trace

    ensure_warm()
    began = time.perf_counter()
    record = {"cell": job.id, "config_sha256": job.cfg.sha256(), "trace_sha256": trace.sha256}
    try:
        plans = plan_pools(job.cfg, job.source)
        result = replay_trace(trace, job.cfg, plans=plans, config_source=job.source)
    except UserError as exc:
        return {**record, "status": "failed", "error": str(exc), "replay_s": time.perf_counter() - began}, None
    except Exception as exc:  # a bug, but one cell's: recorded with where it happened
        where = traceback.extract_tb(exc.__traceback__)[-1]
        error = f"{type(exc).__name__}: {exc} (at {where.filename}:{where.lineno})"
        return {**record, "status": "failed", "error": error, "replay_s": time.perf_counter() - began}, None
    record = {**record, "status": "ok", "error": None, "replay_s": time.perf_counter() - began,
              "summary": result.summary}
    return record, (result if job.keep_run else None)
