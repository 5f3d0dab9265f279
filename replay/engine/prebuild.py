"""A cold compile on two cores: a helper process compiles some of the engine's kernels.

numba compiles on one thread. A replay's kernels are one call tree under `loop.advance_nb`
(and a few the host calls): typing a call compiles the callee for the call's argument types,
into a library that every caller links in, and saves it in numba's on-disk cache, keyed by those
types. A callee another process compiled and cached is loaded, not compiled, when advance_nb is
typed, and linked in as the same LLVM module (numba caches each kernel's machine code with the
module its callers link, `CPUCodeLibrary.serialize_using_object_code`). So on a cold cache an
engine starts a helper interpreter as soon as its state exists (`start`); at the first
`advance` it compiles `OWN` while the helper compiles `HELPER`, each callee for the types
advance_nb calls it with; then advance_nb, which finds them all cached, while the helper
compiles `HOST`, the kernels the replay calls next: advance_nb's entry (`loop.enter_nb`, which
unboxes the state and calls advance_nb by address, so it compiles without it) and the rest. Same code, same cache keys
(replay/_numba_cache.py), same kernels as a compile in one process; a helper that fails or
cannot start only costs time, as whatever is not cached is compiled where it is needed.

A first `llm-replay run` starts the helper before it imports anything heavy (`spawn`, from
llm_replay/entry.py): the helper imports numba and the kernel modules (~1 s) while this process
imports its own and loads the trace, then waits for its jobs, which `start` hands it.

Measured: bench/bench_compile.py (--helper both compares it with one process; --command times
the Quick start's first `llm-replay run` as a whole, with the CPU along its longest chain).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

# advance_nb's parameters, by name, stand for their types in the argument lists below ("int64":
# an int64; "counts": the int64[replicas, columns] array `snapshot` fills; "times": a read-only
# int64 array, as polars hands a column to numpy; "ints", "floats": 1-d arrays). Each kernel is
# named by its module and its name there, with the variant flag (engine/variants.py) without
# which advance_nb does not call it. tests/unit/test_prebuild.py holds each to the types its
# callers call it with: one that drifted would be compiled twice, not wrong.
_STATE = ("rq", "blocks", "reps", "pools", "ev", "th", "tbs")
_STEP = (*_STATE, "int64", "int64")  # (..., r, t) and arrive's (..., q, t)
_QUIET = (*_STATE[:4], *_STATE[5:], "int64")  # the state without the event buffer, then r or until
# The helper's share before advance_nb's compile: schedule's tree, the largest of advance_nb's
# (~1/3 of the plain variant's compile), and the full variant's KV transfers and routers' views.
HELPER = (
    ("replay.engine.scheduling", "schedule", _STEP, None),
    ("replay.engine.transfer", "finish_transfer", (*_STATE, "int64"), "pd"),
    ("replay.engine.routing", "refresh_views", (*_QUIET, "int64"), "policies"),
)
# ... and while advance_nb is compiled: the kernels the host calls, advance_nb's entry (its
# address an int64), the engine's and the run's metrics (fleet/metrics.py `_window_stats`), the
# control plane's scrape (fleet/scrape.py).
HOST = (
    ("replay.engine.loop", "enter_nb", ("int64", *_STATE, "int64"), None),
    ("replay.engine.loop", "snapshot_nb", ("reps", "int64", "counts"), None),
    ("replay.engine.lazy", "sync_lazy_nb", ("rq", "reps"), None),
    ("replay.fleet.metrics", "_window_percentiles_ranked", ("times", "floats", "ints", "ints", "int64", "floats"),
     None),
    ("replay.fleet.scrape", "scrape_nb", ("counts", "counts", "int64", "ints", "ints", "ints", "ints", "int64",
                                          "counts", "counts", "floats", "floats"), None),
)
# This process's share, before advance_nb's compile.
OWN = (
    ("replay.engine.routing", "arrive", _STEP, None),
    ("replay.engine.loop", "synced", _QUIET, None),
    ("replay.engine.scheduling", "finish_step", _STEP, None),
    ("replay.engine.quiet", "quiet_land", _QUIET, None),
    ("replay.engine.quiet", "quiet_begin", ("reps", "pools", "int64"), None),
    ("replay.engine.routing", "check_policy_ids", ("pools", "ev"), None),
)

_STARTED: set[str] = set()  # the variants whose kernels this process compiled ahead
# variant -> its helper, and when it started (monotonic, and this process's CPU time then)
_HELPERS: dict[str, tuple[subprocess.Popen, float, float]] = {}
_SPAWNED: list[subprocess.Popen] = []  # a helper started by `spawn`, waiting for its jobs


def spawn() -> None:
    """Start the helper interpreter now, before this process imports the engine, when a replay
    is about to compile the kernels of a fresh install (the plain variant not cached) on two
    cores or more: its imports then overlap this process's, and `start` hands it its jobs. A
    helper nothing hands jobs to exits when this process does (its stdin closes)."""
    from replay import _numba_cache

    if _SPAWNED or not helps() or _numba_cache.kernels_cached("plain"):
        return
    proc = _start_helper()
    if proc is not None:
        _SPAWNED.append(proc)


def start(variant: str, args: tuple) -> None:
    """On a cold cache, when an engine in `variant` has its state tuples `args` (advance_nb's):
    start the helper on `HELPER` then `HOST` (or hand them to the one `spawn` started). Nothing
    on one core, where a helper only adds its start-up, nor once the variant is cached or was
    started in this process."""
    from replay import _numba_cache

    if variant in _STARTED or _numba_cache.kernels_cached(variant) or not helps():
        return
    _STARTED.add(variant)
    advance = _kernel("replay.engine.loop", "advance_nb", variant)
    if not hasattr(advance, "overloads") or advance.overloads:  # no JIT, or compiled in this process
        return
    jobs = [[job[:2] + (sig,) for job, sig in _jobs(plan, variant, args)] for plan in (HELPER, HOST)]
    # A helper spawned ahead imported while this process did: its CPU counts from its jobs on.
    ahead = bool(_SPAWNED)
    proc = _SPAWNED.pop() if ahead else _start_helper()
    if proc is not None and _send(proc, (variant, jobs, not ahead)):
        _HELPERS[variant] = proc, time.monotonic(), time.process_time()


@contextlib.contextmanager
def compile_ahead(variant: str, args: tuple) -> Iterator[None]:
    """Around advance_nb's first compile in `variant` (engine/numba_engine.py), when `start`
    started a helper: compile `OWN` here, wait until the helper has compiled `HELPER`, compile
    advance_nb (the body of the `with`), then wait for the helper to finish `HOST`."""
    from replay import _numba_cache

    proc, started, cpu = _HELPERS.pop(variant, (None, 0.0, 0.0))
    if proc is None:
        yield
        return
    stop = threading.Timer(max(1.0, HELPER_TIMEOUT_S - (time.monotonic() - started)), proc.kill)
    stop.start()  # a helper stuck that long is stopped: what it has not cached is compiled here
    try:
        for (module, name, _, _), sig in _jobs(OWN, variant, args):
            _kernel(module, name, variant).compile(sig)
        own_cpu = time.process_time() - cpu
        helper_cpu = _reported(proc)
        cpu = time.process_time()
        yield
        own_cpu2 = time.process_time() - cpu
        helper_cpu2 = _reported(proc) - helper_cpu  # (it reports its CPU so far)
        proc.wait()  # it exits once it has reported (or `stop` ends it)
    finally:
        stop.cancel()
        if proc.poll() is None:  # interrupted: leave no compiler running behind
            proc.kill()
        proc.wait()
        proc.stdout.close()
    # The compile's time is its longest chain: the helper's CPU beyond this process's meanwhile.
    beyond = max(0.0, helper_cpu - own_cpu) + max(0.0, helper_cpu2 - own_cpu2)
    _numba_cache.HELPER_CPU_S[variant] = _numba_cache.HELPER_CPU_S.get(variant, 0.0) + beyond


# A helper that has not finished this long after it started is stopped.
HELPER_TIMEOUT_S = 600.0


def _reported(proc: subprocess.Popen) -> float:
    """Wait for the helper's next line: the CPU seconds of the part of its work it finished (0 if
    it failed, or was stopped)."""
    try:
        return float(proc.stdout.readline().decode())
    except ValueError:
        return 0.0


def helper_pids() -> list[int]:
    """This process's helpers (the spawned one waiting for its jobs, those compiling)."""
    return [proc.pid for proc in _SPAWNED + [helper for helper, _, _ in _HELPERS.values()]]


def helps() -> bool:
    """Whether a cold compile here gets a helper: on two cores or more."""
    return _cores() >= 2


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _jobs(plan: tuple, variant: str, args: tuple) -> list[tuple[tuple, tuple]]:
    """The plan's kernels that `variant` calls, each with its argument types."""
    import numpy as np
    from numba import typeof, types

    from replay.engine.variants import VARIANTS

    named = dict(zip(_STATE, (typeof(a) for a in args)))
    named.update(int64=types.int64, counts=types.Array(types.int64, 2, "C"), ints=types.Array(types.int64, 1, "C"),
                 floats=types.Array(types.float64, 1, "C"), times=types.Array(types.int64, 1, "C", readonly=True))
    used = VARIANTS[variant]._asdict()
    return [(job, tuple(named[a] for a in job[2])) for job in plan if job[3] is None or used[job[3]]]


def _kernel(module: str, name: str, variant: str) -> Any:
    import importlib

    from replay.engine.variants import specialise

    return specialise(getattr(importlib.import_module(module), name), variant)


def _start_helper() -> subprocess.Popen | None:
    """The helper interpreter, keyed to this process's cache directory; it waits for its jobs."""
    import numba

    try:
        # the same replay package as this process's, whatever put it on sys.path; -P: not the working
        # directory's first (`-m` would put it there: run from a checkout beside a `pip install .`, the
        # helper compiled the checkout's files, which numba's cache keys apart, and nothing was shared)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))}
        return subprocess.Popen([sys.executable, "-P", "-m", "replay.engine.prebuild", numba.config.CACHE_DIR],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    except OSError:
        return None  # compiled here instead, when advance_nb is typed


def _send(proc: subprocess.Popen, jobs: tuple) -> bool:
    """Hand the helper its jobs; False (and the helper ended) if it cannot take them."""
    try:
        payload = pickle.dumps(jobs)
        with proc.stdin:
            proc.stdin.write(payload)
        return True
    except (OSError, pickle.PicklingError):  # it died, or the types do not pickle
        proc.kill()
        proc.wait()
        proc.stdout.close()
        return False


def _helper_main() -> None:
    """The helper: import the kernel modules, then compile each list of jobs on stdin into the
    parent's cache (argv[1]), and after each print its CPU seconds so far (from its start, or
    from when its jobs came if it imported ahead of them). Nothing on stdin: nothing to do."""
    from replay import _numba_cache  # noqa: F401 - keys the cache; the parent's directory wins
    import numba

    numba.config.CACHE_DIR = sys.argv[1]  # before any kernel is defined, the policies' included
    import replay.engine.loop  # noqa: F401 - the engine's kernels and the policies', while the parent imports
    import replay.fleet.metrics  # noqa: F401
    import replay.fleet.scrape  # noqa: F401

    payload = sys.stdin.buffer.read()
    if not payload:
        return
    variant, parts, from_start = pickle.loads(payload)
    base = 0.0 if from_start else time.process_time()
    for jobs in parts:
        for module, name, sig in jobs:
            _kernel(module, name, variant).compile(sig)
        print(f"{time.process_time() - base:.3f}", flush=True)


if __name__ == "__main__":
    _helper_main()
