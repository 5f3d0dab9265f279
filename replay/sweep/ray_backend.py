"""`sweep --backend ray`: each cell a Ray task, each trace in the object store once (`ray.put`),
each Ray worker process warming the engine once (replay/sweep/worker.py). Ray is an optional
extra (`pip install 'llm-replay[ray]'`), imported only here and only when this backend is asked for.

Records and runs come back to the driver, which alone writes --out: a cluster's nodes need not
share its file system.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from common.errors import UserError
from replay.sweep.worker import Job

CONNECT_TIMEOUT_S = 5.0


def _import_ray():
    try:
        import ray
    except ImportError:
        raise UserError("--backend ray: ray is not installed; pip install 'llm-replay[ray]'") from None
    return ray


def check_backend(backend: str, address: str | None, where: str = "") -> None:
    """A command's --backend/--address, before any work: --address needs ray, a missing extra or a
    dead head is said at once. `where` prefixes the messages (e.g. "plan: ")."""
    if address is not None and backend != "ray":
        raise UserError(f"{where}--address: only with --backend ray")
    if backend == "ray":
        _import_ray()
        if address is not None:
            check_reachable(address)


def check_reachable(address: str) -> None:
    """ray.init retries an unreachable head for minutes; a closed port is said at once instead."""
    if address == "auto" or address.startswith("local"):
        return
    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise UserError(f"--address {address}: expected HOST:PORT (or ray://HOST:PORT, or auto)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise UserError(f"--address {address}: no Ray cluster answers there ({exc.strerror or exc}); "
                        "start one with `ray start --head`, or leave out --backend ray") from None


@contextmanager
def connected(address: str | None, workers: int) -> Iterator[Any]:
    """Ray, connected: a cluster already initialised in this process is used as it is; else the
    one at `address`, else a local one of `workers` CPUs, shut down again afterwards."""
    ray = _import_ray()
    if ray.is_initialized():
        yield ray
        return
    if address is not None:
        check_reachable(address)
    env = {k: os.environ[k] for k in ("NUMBA_CACHE_DIR",) if k in os.environ}
    try:
        if address is not None:
            ray.init(address=address, runtime_env={"env_vars": env}, logging_level="ERROR",
                     log_to_driver=False)
        else:
            ray.init(num_cpus=workers, runtime_env={"env_vars": env}, logging_level="ERROR",
                     log_to_driver=False, include_dashboard=False)
    except ConnectionError as exc:
        raise UserError(f"--address {address}: cannot connect to Ray ({str(exc).splitlines()[0]})") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def _remote_cell(job: Job, trace: Any, plugins: list[str]) -> tuple[dict, Any]:
    from policies.plugins import load_plugins
    from replay.sweep.worker import run_cell

    load_plugins(plugins)
    return run_cell(job, trace)


def ray_cells(jobs: list[Job], traces: dict, plugins: list[str], address: str | None,
              workers: int) -> Iterator[tuple[Job, dict, Any]]:
    with connected(address, workers) as ray:
        task = ray.remote(num_cpus=1, max_retries=1)(_remote_cell)
        refs = {key: ray.put(trace) for key, trace in traces.items()}  # once each, whatever the cells
        futures = {task.remote(job, refs[job.trace_key], plugins): job for job in jobs}
        while futures:
            done, _ = ray.wait(list(futures), num_returns=1)
            for ref in done:
                job = futures.pop(ref)
                try:
                    record, run = ray.get(ref)
                except ray.exceptions.RayError as exc:  # the task's worker died, or the node went
                    record, run = {"cell": job.id, "config_sha256": job.cfg.sha256(), "status": "failed",
                                   "replay_s": None, "error": f"ray: {str(exc).splitlines()[0]}"}, None
                yield job, record, run
