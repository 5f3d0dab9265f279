"""Keys numba's on-disk cache on the kernel sources; imported first by every module with kernels."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

# Modules whose code (or constants, which numba freezes into a kernel) ends up in compiled kernels:
# the numba engine's modules (its host side, numba_engine.py, and the pure-Python reference/ are
# not compiled), the step model and the metrics kernels. tests/unit/test_numba_cache.py checks that
# every module with a kernel, and every replay module a kernel module imports, is listed.
_KERNEL_SOURCES = (
    "engine/common.py",
    "engine/variants.py",
    "engine/state.py",
    "engine/events.py",
    "engine/queues.py",
    "engine/kvblocks.py",
    "engine/routing.py",
    "engine/sessions.py",
    "engine/transfer.py",
    "engine/lora.py",
    "engine/lazy.py",
    "engine/quiet.py",
    "engine/scheduling.py",
    "engine/loop.py",
    "model/stepmodel.py",
    "fleet/metrics.py",
    "fleet/scrape.py",
)
# The per-step policies' kernels (policies/<family>/*.py) are inlined into the engine's too.
_POLICY_KERNEL_DIRS = ("routers", "victims", "queue_orders", "admission")


def _key_numba_cache() -> None:
    """Give the numba cache a directory per version of the kernel sources.

    Numba checks a cached kernel against its own file's timestamp only. The engine's kernels
    inline functions and constants from other modules, so after an upgrade a changed
    `engine/kvblocks.py` or `stepmodel.py` would leave a stale kernel in the cache. Runs before any
    kernel module is imported; the user's NUMBA_CACHE_DIR (else ~/.cache) is the parent.
    """
    import numba

    digest = hashlib.sha256()
    for path in kernel_sources():
        digest.update(path.read_bytes())
    parent = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "llm-replay")
    numba.config.CACHE_DIR = os.path.join(parent, f"kernels-{digest.hexdigest()[:16]}")


def kernel_sources() -> list[Path]:
    """Every source file the cache is keyed on, in a fixed order."""
    here = Path(__file__).resolve().parent
    paths = [here / name for name in _KERNEL_SOURCES]
    policies = here.parent / "policies"
    for family in _POLICY_KERNEL_DIRS:
        paths.extend(sorted((policies / family).glob("*.py")))
    paths.append(policies / "_dispatch.py")
    paths.append(policies / "registry.py")  # the order of the kernels is their ids
    # Users' policies: the call by address (an intrinsic), the links' helpers and view columns.
    paths += [policies / "_native.py", policies / "_userview.py", policies / "user.py"]
    return paths


_key_numba_cache()


# CPU seconds of one cold compile of every kernel a replay in each variant uses (engine/variants.py;
# bench/bench_compile.py on this project's 2-core machine, issue 15), along its longest chain: the
# estimate's basis until a compile was timed here, rounded up so that it errs long. On 2 cores
# a helper process compiles part of it (engine/prebuild.py): the plain variant 18.7-19.4 s at a
# load of ~2 (`--command`; 19.4-22.0 s at 2.7-7.9), the full one 34.2-34.3 s at a load of 5-7 (a
# busy machine slows its cores too); in one process the plain variant 34-36 s at loads of 5-7
# (32.5-34 s at 4-6), the full one 49-53 s (every kernel took 63-66 s before the variants). numba
# compiles on one thread, so its wall time is this over the share of a core it gets
# (`core_share`), which the estimate says. Since advance_nb's entry compiles apart, in the
# helper (engine/loop.py `enter_nb`), the plain variant's chain is ~2 s shorter (22.9-23.4 s
# against 24.9-25.4 s at loads 8-12, alternated): 20 s still errs long at a load of ~2.
COLD_COMPILE_CPU_S = {"plain": 20.0, "full": 40.0}
ONE_CORE_COMPILE_CPU_S = {"plain": 36.0, "full": 60.0}


def _marker(variant: str) -> str:
    return f"compiled-{variant}.json"


def kernels_cached(variant: str = "plain") -> bool:
    """Whether this version's kernels of `variant` were compiled into the cache (by a warm-up
    that finished)."""
    import numba

    return os.path.exists(os.path.join(numba.config.CACHE_DIR, _marker(variant)))


def core_share() -> float:
    """The share of one core each of the compile's processes (this one, and its helper on two
    cores or more: engine/prebuild.py) gets now: all of one on an idle machine, cores / tasks on
    a busy one. The tasks running now, not the load average, which still counts for a minute what
    has stopped (the `pip install` just before a first run, or a previous compile)."""
    from replay.engine.prebuild import helps

    others = _running_elsewhere()
    if others is None:  # not Linux: the last minute's load average
        try:
            others = os.getloadavg()[0]
        except (OSError, AttributeError):  # no load average on this platform
            return 1.0
    return min(1.0, (os.cpu_count() or 1) / (others + (2 if helps() else 1)))


def _running_elsewhere() -> float | None:
    """Tasks running on the machine now besides this process's and its helper's (polars' pool
    spins a while after work): the median of a few samples of the kernel's count of runnable
    tasks (/proc/loadavg) less our own runnable threads, None without /proc."""
    import time

    from replay.engine.prebuild import helper_pids

    samples = []
    try:
        for _ in range(5):
            with open("/proc/loadavg") as fh:
                running = int(fh.read().split()[3].split("/")[0])
            samples.append(running - _running_threads(["self", *helper_pids()]))
            time.sleep(0.01)
    except (OSError, ValueError, IndexError):
        return None
    return float(max(0, sorted(samples)[len(samples) // 2]))


def _running_threads(pids: list) -> int:
    """The threads of these processes that are runnable now (/proc/PID/task/*/stat)."""
    n = 0
    for pid in pids:
        for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
            try:
                n += stat.read_text().rsplit(")", 1)[1].split()[0] == "R"
            except (OSError, IndexError):
                continue
    return n


def compile_estimate_s(variant: str = "plain") -> tuple[float, str]:
    """How long a cold compile of `variant` will take here, and why we think so: the CPU seconds
    of the last five compiles of it timed on this machine (earlier versions', in the same cache),
    else the measured figure, over the share of a core the compile gets at the machine's present
    load."""
    import json

    import numba

    parent = os.path.dirname(numba.config.CACHE_DIR)
    timed = []
    for path in Path(parent).glob(f"kernels-*/{_marker(variant)}"):
        try:
            timed.append((path.stat().st_mtime, float(json.loads(path.read_text())["compile_cpu_s"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    if timed:
        # The median of the last five: one compile that found most kernels cached already (a
        # version that changed one file, or the full variant after the plain one) must not
        # promise a cold compile in seconds.
        recent = sorted(seconds for _, seconds in sorted(timed)[-5:])
        cpu, basis = recent[len(recent) // 2], "the recent compiles on this machine"
    else:
        from replay.engine.prebuild import helps

        if helps():
            cpu, basis = COLD_COMPILE_CPU_S[variant], "on a 2-core machine"
        else:
            cpu, basis = ONE_CORE_COMPILE_CPU_S[variant], "on one core"
    share = core_share()
    if share < 0.95:
        basis += f", at this machine's load ({share:.0%} of a core)"
    return cpu / share, basis


# Per variant: CPU seconds that a helper process compiled beyond what this one did meanwhile
# (engine/prebuild.py), which a compile's CPU time in this process leaves out.
HELPER_CPU_S: dict[str, float] = {}


def mark_compiled(seconds: float, cpu_seconds: float | None = None, variant: str = "plain") -> None:
    """Record that the kernels of `variant` are in the cache, and how long compiling them took:
    wall, and CPU along the compile's longest chain (this process's, and a helper's beyond it)."""
    import json

    import numba

    body = {"compile_s": round(seconds, 1)}
    if cpu_seconds is not None:
        body["compile_cpu_s"] = round(cpu_seconds + HELPER_CPU_S.pop(variant, 0.0), 1)
    try:
        with open(os.path.join(numba.config.CACHE_DIR, _marker(variant)), "w") as fh:
            json.dump(body, fh)
    except OSError:
        pass  # a read-only cache only loses the estimate
