"""`plan --backend ray`: the plan's replays as Ray tasks, behind the same `concurrent.futures`
executor the driver uses for local workers (replay/plan/driver.py), so the searches, and with
them the answer, are the same whichever runs the replays.

The trace goes to the object store once (`ray.put`); each Ray worker process loads the --plugin
modules and warms the engine once, however many replays it then runs. Ray is the optional `ray`
extra, connected as `sweep --backend ray` connects (replay/sweep/ray_backend.py).
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from contextlib import ExitStack
from typing import Any

from common.errors import UserError

POLL_S = 0.2  # how long the collector waits on Ray before looking for new submissions

_warm = False  # per Ray worker process


def _remote_replay(fn, trace: Any, plugins: list[str], engine: str, *args: Any) -> tuple[str, Any]:
    """In a Ray worker: (ok, fn's result) or (user, the message of the UserError it raised): a
    user's mistake travels as its message, not as Ray's wrapped exception."""
    global _warm
    from replay.plan import driver

    if not _warm:
        driver._init_worker(trace, plugins, engine)
        _warm = True
    driver.set_worker_trace(trace)
    try:
        return "ok", fn(*args)
    except UserError as exc:
        return "user", str(exc)


class RayPool(cf.Executor):
    """Each `submit(fn, *args)` is one Ray task; a collector thread completes the futures as the
    tasks finish (a task whose worker died fails its future with a UserError that says so)."""

    def __init__(self, trace: Any, plugins: list[str], engine: str, address: str | None, workers: int):
        from replay.sweep.ray_backend import connected

        self._stack = ExitStack()
        self._ray = self._stack.enter_context(connected(address, workers))
        self._task = self._ray.remote(num_cpus=1, max_retries=1)(_remote_replay)
        self._trace = self._ray.put(trace)
        self._plugins, self._engine = list(plugins), engine
        self._pending: dict[Any, cf.Future] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._collector = threading.Thread(target=self._collect, name="plan-ray-collector", daemon=True)
        self._collector.start()

    def submit(self, fn, /, *args, **kwargs):
        if kwargs:
            raise TypeError("RayPool.submit takes positional arguments only")
        future: cf.Future = cf.Future()
        future.set_running_or_notify_cancel()
        ref = self._task.remote(fn, self._trace, self._plugins, self._engine, *args)
        with self._lock:
            self._pending[ref] = future
        return future

    def _collect(self) -> None:
        ray = self._ray
        while not self._stop.is_set():
            with self._lock:
                refs = list(self._pending)
            if not refs:
                self._stop.wait(POLL_S)
                continue
            done, _ = ray.wait(refs, num_returns=1, timeout=POLL_S)
            for ref in done:
                with self._lock:
                    future = self._pending.pop(ref)
                try:
                    kind, value = ray.get(ref)
                except ray.exceptions.RayError as exc:  # the task's worker died, or its node went
                    future.set_exception(UserError(f"ray: {str(exc).splitlines()[0]}"))
                    continue
                except BaseException as exc:  # noqa: BLE001 - a bug in the replay: the driver raises it
                    future.set_exception(exc)
                    continue
                if kind == "user":
                    future.set_exception(UserError(value))
                else:
                    future.set_result(value)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._stop.set()
        self._collector.join()
        with self._lock:
            for future in self._pending.values():
                future.cancel()
            self._pending.clear()
        self._stack.close()
