"""A cold compile on two cores: a helper process compiles some of advance_nb's callees.

numba compiles on one thread. A replay's kernels are one call tree under `loop.advance_nb`
(and a few the host calls): typing a call compiles the callee for the call's argument types,
into a library that every caller links in, and saves it in numba's on-disk cache, keyed by those
types. A callee another process compiled and cached is loaded, not compiled, when advance_nb is
typed, and linked in as the same LLVM module (numba caches each kernel's machine code with the
module its callers link, `CPUCodeLibrary.serialize_using_object_code`). So on a cold cache the
engine's first `advance` compiles advance_nb's callees ahead of it, with the argument types
advance_nb calls them with: those of `HELPER` in a second interpreter, those of `OWN` itself
meanwhile; then it waits for the helper and compiles advance_nb, which finds them all cached.
Same code, same cache keys (replay/_numba_cache.py), same kernels as a compile in one process;
a helper that fails or cannot start only costs time, as whatever is not cached is compiled.

Measured (bench/bench_compile.py, the plain variant on this project's 2-core machine): see there.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from typing import Any

# advance_nb's parameters, by name, stand for their types in the argument lists below ("int64":
# an int64; "counts": the int64[replicas, columns] array `snapshot` fills). Each callee is named
# by its module and its name there, with the variant flag (engine/variants.py) without which
# advance_nb does not call it. tests/unit/test_prebuild.py holds each to the types a compile of
# advance_nb calls it with: one that drifted would be compiled twice, not wrong.
_STATE = ("rq", "blocks", "reps", "pools", "ev", "th", "tbs")
_STEP = (*_STATE, "int64", "int64")  # (..., r, t) and arrive's (..., q, t)
_QUIET = (*_STATE[:4], *_STATE[5:], "int64")  # the state without the event buffer, then r or until
# The helper's share: schedule's tree is the largest of advance_nb's (~1/3 of the plain compile),
# then two host kernels the first replay calls after advance_nb.
HELPER = (
    ("replay.engine.scheduling", "schedule", _STEP, None),
    ("replay.engine.loop", "snapshot_nb", ("reps", "int64", "counts"), None),
    ("replay.engine.lazy", "sync_lazy_nb", ("rq", "reps"), None),
)
OWN = (
    ("replay.engine.routing", "arrive", _STEP, None),
    ("replay.engine.loop", "synced", _QUIET, None),
    ("replay.engine.scheduling", "finish_step", _STEP, None),
    ("replay.engine.quiet", "quiet_land", _QUIET, None),
    ("replay.engine.quiet", "quiet_begin", ("reps", "pools", "int64"), None),
    ("replay.engine.routing", "check_policy_ids", ("pools", "ev"), None),
    ("replay.engine.transfer", "finish_transfer", (*_STATE, "int64"), "pd"),
    ("replay.engine.routing", "refresh_views", (*_QUIET, "int64"), "policies"),
)

_STARTED: set[str] = set()  # the variants whose callees this process compiled ahead


def compile_ahead(variant: str, args: tuple) -> None:
    """Before advance_nb's first compile in `variant` (engine/numba_engine.py), on a cold cache:
    compile its callees `HELPER` in a second process and `OWN` here, for the types of advance_nb's
    arguments `args`. Does nothing on one core, where a helper only adds its start-up."""
    from replay import _numba_cache

    if variant in _STARTED or _numba_cache.kernels_cached(variant) or _cores() < 2:
        return
    _STARTED.add(variant)
    started, cpu = time.monotonic(), time.process_time()
    helper = _start_helper(variant, [job[:2] + (sig,) for job, sig in _jobs(HELPER, variant, args)])
    try:
        for (module, name, _, _), sig in _jobs(OWN, variant, args):
            _kernel(module, name, variant).compile(sig)
    finally:
        own_cpu = time.process_time() - cpu
        helper_cpu = _finish_helper(helper, started)
    # The compile's time is its longest chain: the helper's CPU beyond this process's meanwhile.
    _numba_cache.HELPER_CPU_S[variant] = _numba_cache.HELPER_CPU_S.get(variant, 0.0) + max(0.0, helper_cpu - own_cpu)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _jobs(plan: tuple, variant: str, args: tuple) -> list[tuple[tuple, tuple]]:
    """The plan's callees that `variant` calls, each with its argument types."""
    import numpy as np
    from numba import typeof, types

    from replay.engine.variants import VARIANTS

    named = dict(zip(_STATE, (typeof(a) for a in args)))
    named["int64"] = types.int64
    named["counts"] = typeof(np.empty((1, 1), np.int64))
    used = VARIANTS[variant]._asdict()
    return [(job, tuple(named[a] for a in job[2])) for job in plan if job[3] is None or used[job[3]]]


def _kernel(module: str, name: str, variant: str) -> Any:
    import importlib

    from replay.engine.variants import specialise

    return specialise(getattr(importlib.import_module(module), name), variant)


def _start_helper(variant: str, jobs: list) -> subprocess.Popen | None:
    import numba

    if not jobs:
        return None
    try:
        proc = subprocess.Popen([sys.executable, "-m", "replay.engine.prebuild"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        proc.stdin.write(pickle.dumps((numba.config.CACHE_DIR, variant, jobs)))
        proc.stdin.close()
    except (OSError, pickle.PicklingError):
        return None  # compiled here instead, when advance_nb is typed
    return proc


# A helper stuck for longer than this is stopped (its callees are then compiled here).
HELPER_TIMEOUT_S = 600.0


def _finish_helper(proc: subprocess.Popen | None, started: float) -> float:
    """Wait for the helper; the CPU seconds it reported (0 if it failed)."""
    if proc is None:
        return 0.0
    try:
        proc.wait(timeout=max(1.0, HELPER_TIMEOUT_S - (time.monotonic() - started)))
    except BaseException as exc:  # stuck, or interrupted: leave no compiler running behind
        proc.kill()
        proc.wait()
        proc.stdout.close()
        if isinstance(exc, subprocess.TimeoutExpired):
            return 0.0
        raise
    with proc.stdout:
        out = proc.stdout.read().decode().split()  # one short line: no pipe filled while it ran
    try:
        return float(out[-1]) if proc.returncode == 0 and out else 0.0
    except ValueError:
        return 0.0


def _helper_main() -> None:
    """The helper: compile the jobs on stdin into the parent's cache, print its CPU seconds
    (its start-up's too)."""
    cache_dir, variant, jobs = pickle.load(sys.stdin.buffer)
    from replay import _numba_cache  # noqa: F401 - keys the cache; the parent's directory wins
    import numba

    numba.config.CACHE_DIR = cache_dir
    for module, name, sig in jobs:
        _kernel(module, name, variant).compile(sig)
    print(f"{time.process_time():.3f}")


if __name__ == "__main__":
    _helper_main()
