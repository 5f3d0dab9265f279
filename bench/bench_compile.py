"""The first run's cost: the cold compile of the engine's kernels, and loading them once cached.

    python bench/bench_compile.py                 # 2 cold compiles, each followed by a cached load
    python bench/bench_compile.py --cold 3 --profile   # and where the compile's CPU time goes
    python bench/bench_compile.py --variant full  # the kernels with every feature (replay/engine/variants.py)
    python bench/bench_compile.py --cold 2 --helper both  # with the helper process and without, alternated
    python bench/bench_compile.py --command 3 [--cores 1] [--baseline DIR]  # the Quick start's first run

With --command N the cold figure is the README's Quick start as a fresh install first runs it:
`llm-replay run --out DIR` (the bundled trace, the default fleet, no terminal) on an empty cache,
N times, each followed by the same command on the cache it filled; with the notice's estimate
beside what the compile and the whole command then took, and the CPU seconds along the command's
longest chain (this process's, and the helper's beyond it). --cores 1 runs it on one core
(`taskset`: no helper process); --baseline DIR alternates each run with the checkout in DIR.

Each cold run is a fresh interpreter with an empty NUMBA_CACHE_DIR that calls `replay.run.warm_up`
(what the first `llm-replay run` of an install does before replaying); the cached run is a second
fresh interpreter on the same cache, then the README's Quick start replay (`llm-replay run`, the
bundled Azure conversation trace on the default fleet) as a whole command. Each figure is wall
time (the machine is shared: the CPU seconds are printed beside it) and the child's peak RSS.

With --profile the cold child records numba's compiler events (`numba.core.event`): the CPU
seconds of each compiler pass, exclusive of the passes of functions compiled inside it, summed per
function and per pass, and every function compiled for more than one signature.

What it found (issue 15 item 3; 2-core machine at load 5-8, CPU seconds of one cold compile;
wall time is these over the share of a core the compile got):
- before: everything below the event loop was inlined into `advance_nb` by numba's IR inliner
  (`inline="always"`): 133-140 s CPU (189 s wall at load 2-3 and 245 s at load 6, 1.6 GB peak
  RSS; this script run on main's checkout). native_lowering 78 s
  (advance_nb's own 43 s; at NUMBA_OPT=0 it is 29 s, so ~50 s is LLVM's optimisation),
  inline_inlinables 42 s (each callee's untyped pipeline rerun at every call site,
  recursively), reconstruct_ssa 6 s, typing 7 s. Of the calls that were not inlined (arrive,
  route, admit, remote_prefill, refresh_views, finish_transfer, ...) ~85% of each compile was
  the Python and C wrappers that unbox the state tuples: refresh_views alone 1.6 s with them,
  0.23 s without.
- LLVM inlining (`forceinline=True`) with the wrappers kept was worse: 164 s CPU, ~3 s of
  native_lowering per inner function, nearly all of it wrappers.
- after (forceinline, no_cpython_wrapper, no_cfunc_wrapper on every inner kernel): 49-56 s CPU,
  550 MB peak RSS; typing 6 s, native_lowering 41 s spread over ~150 compiled signatures
  (advance_nb 7 s, the dispatch links 5 s, the policy kernels 5 s). ~40 of them are the same
  function again for a literal argument (record x10, unknown_policy x5, reject x4, the policy
  kernels x2): numba specialises a callee per literal int at a call site. Replay speed is
  unchanged (bench_replay.py --only-engine numba). At load 2.2 the compile got a whole core:
  40.0 and 40.1 s wall (39.6 and 40.0 s CPU), cached load 0.35 s, `llm-replay run` 2.1 s. A
  first autoscaled run compiles reset_replica_nb and release_held_nb too (0.7 s CPU).
- kernel variants (engine/variants.py) and typed arguments (issue 15 item 3, 2-core machine at
  load 4-6, one cold compile each, alternated in the same period): main's engine, which compiled
  every feature, 63.1 and 66.0 s CPU (784 MB); the plain variant the Quick start runs 33.3 and
  34.3 s CPU (578 MB, 109 signatures compiled instead of 215, numba's own counted); the full
  variant 52.5 and 48.9 s CPU (748 MB): with P/D, LoRA, speculative decoding, sessions, users' policies and the other built-in
  policies pruned before typing, and no callee compiled again for a literal argument (numba types
  a call's int constant, or a variable's first value, as a literal and compiles the callee for it:
  record x10, unknown_policy x5, reject x4, the routers and victims x2, ...). Where the plain
  variant's time goes (--profile at load 3-4: 33.0 s CPU, 109 signatures): native lowering 28.0 s,
  typing 2.6 s; advance_nb 5.8, schedule_running 1.6, place 1.2, lazy_running 1.1, schedule 1.1,
  arrive 0.9, schedule_waiting 0.9, finish_step 0.8, then ~95 functions under 0.8 s each: each
  inner kernel's own module is optimised with its callees linked in and turned into machine code
  (numba's `CodeLibrary.finalize`), then again inside each caller, so the cost follows the depth
  of the call tree more than the code's size (session 10 measured skipping the inner kernels'
  optimisation: a 20% slower replay; their machine code and cache writes: 6% of the compile).
  The replay core is not slower (process CPU s, medians of 3 alternations of 5 runs, load 3-4):
  bundled conv trace on 4 replicas 0.131 before, 0.120 plain, 0.134 full; 100k Poisson requests
  on 64 replicas 0.633, 0.576, 0.636.
- where the plain compile's 34 s CPU went (load 2; LLVM timed by wrapping numba's CodeLibrary):
  LLVM ~21 s (function passes 7.8 over 174 modules, IR parsing ~3.5, module passes 4.8 and machine
  code 4.6 over 126 finalized libraries), numba's Python-side typing and lowering ~13 s; 101 MB of
  LLVM IR text, the state tuples' ~1,200 fields spelled out at every call. A kernel that does
  nothing but takes the whole state costs 2.9 s CPU to compile, all of it its wrappers:
  `no_cfunc_wrapper` on the kernels the host calls took 0.86 s off each (2.06 s).
  NUMBA_OPT: 0 is slower (54.5 s CPU: machine code for unoptimised IR, and uncacheable), 1 saved
  7% in one process (31.7 vs 34.1 s) and nothing with the helper (21.1 vs 21.1 s at load 5-6),
  2 = 3: not set.
- a helper process (engine/prebuild.py; alternated at load 5-7.6, one cold compile each): CPU
  along the longest chain 19.0 and 19.7 s (parent 19.0/19.7 s, helper ~15 s), against 29.8 and
  31.7 s in one process and main's 33.6 and 33.1 s (its wall 75.3/65.9 s); the full variant
  34.2 s (helper 22.7 s) against 49-53 s. Wall time here followed the machine's load, not the
  helper: 73.2/79.5 s with it, 45.5/46.6 s without, 48.9 s in a third run with it: with other
  agents' work on both cores there is no idle core for the helper to use, and on an idle 2-core
  machine the wall time is about the chain's CPU (~19-20 s). Peak RSS 478 MB (and the helper's)
  against 594 MB in one process. Cached load and Quick start unchanged (0.4-0.8 s, 1.7-3.1 s at
  this load); the replay core 0.115/0.085 s against main's 0.126/0.122 s, 1M requests 7.10/6.67 s
  against 8.06/8.11 s, same summaries (bench_events.py --quick, --only-million numba).
- the Quick start's first run as a whole command (--command; issue 15 item 3, a fresh cache each,
  alternated with main's 9ab03d6): where it went (numba's compile events per process, load 3.4):
  the command's process ~1.9 s of imports and set-up, reset_replica_nb (0.9 s CPU, at the
  engine's construction) and the step model's host call (0.6 s: a replica model only autoscalers
  read), its share (11.1 s), advance_nb (6.1 s); the helper, started at the engine's
  construction, imported (0.6 s), compiled schedule's tree (11.9 s), then the host kernels (2.9
  s) while advance_nb compiled; then the replay (0.26 s) and the outputs. Now the helper starts
  before the command's imports (llm_replay/entry.py), no fixed pool compiles the replica model,
  and the percentile kernel's count step compiles once (the literals 1 and -1 compiled it twice).
  Tried and left out: laying out the replicas after advance_nb's compile, so that the helper
  compiles reset_replica_nb (tests and code read a new engine's blocks), and step_duration in
  this process's share (it balanced only with that). At loads 1.9-2.5: 21.1 and 20.2 s wall
  (CPU along the chain 20.4 and 19.7 s; the compile 19.4 and 18.7 s) against 20.7 and 21.0 s
  (20.3, 20.5; 19.3, 19.6): the same past the noise; at loads 2.7-7.9, 6 runs each, 21.9 s
  against 22.6 s CPU (medians). One core (--cores 1, loads 5-7): 36.6 and 40.4 s CPU against 35.2
  and 40.6 s. The serial part is advance_nb's own ~6 s (its module holds every kernel inlined,
  and its CPython wrapper unboxes the ~200 state arrays); the two shares before it are ~11.5 s
  each. NUMBA_LOOP_VECTORIZE=0: 35.6/36.6 s against 36.9/36.5 s CPU in one process, no gain.
  The notice's estimate read the last minute's load average, which still counts what ran before
  (a previous compile, a pip install): about 37-42 s for compiles of 19-20 s at load ~2; it now
  counts the tasks running as it is made, less this process's threads and its helper's: about
  22 s for compiles of 19-20 s.
- advance_nb's entry apart (engine/loop.py `enter_nb`): advance_nb, compiled after every other
  kernel, was the chain's serial tail, and its CPython wrapper (unboxing the state's ~200 arrays)
  a quarter of it: advance_nb alone, its callees cached (load ~9), 7.07 s CPU with the wrapper,
  5.27 s without (function passes 0.9, module passes 1.8 and machine code 1.6 over the inlined
  tree, the rest numba's typing and lowering). The host now enters it through enter_nb, which
  calls it at its native address (the intrinsic users' policies are called with) and types
  nothing of it, so the helper compiles it (2.0 s) with the host's kernels meanwhile. A command
  at load 8, CPU s per compile: this process reset_replica_nb 0.9, its share 15.0 (arrive 7.2,
  finish_step 4.7, quiet_begin 1.0, ...), advance_nb 6.4; the helper schedule 16.0, enter_nb 2.0,
  snapshot_nb 0.5, sync_lazy_nb 0.7, _window_percentiles_ranked 2.4: both halves within ~5%
  (what is left is the helper's wait for the state's types, from its imports to the engine's
  construction). --command 3 alternated with main 7877b5b: CPU along the longest chain
  24.9/24.3/26.5 s against 27.8/28.6/26.1 s at loads 4.1-5.5, and 24.3/24.4/23.8 s against
  26.4/25.9/26.3 s at 7.9-12.2, 20.9/20.6/20.8 s against 23.8/23.5/21.5 s at 2.0-3.6 (the
  compile's 19.9/19.7/20.0 against 22.8/22.5/20.6); wall followed the load (medians 39.5 against
  40.4 s at 2-3.6, 75.8 against 82.0 s at 4-5.5: the helper got no core of its own).
  The price is one more native call per advance with the state's ~1,400 fields: 3.0-3.2 us an
  empty advance against 1.9-2.0 us, ~4 ms over the bundled trace's ~3,500 one-second advances;
  bench_events.py --quick's core 0.163 against 0.174 s and the million 6.39 against 6.16 s
  (medians of 5 and 7 alternations at loads 5-7: within the noise), same summaries.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def child(profile: bool, variant: str, helper: bool) -> None:
    """In a fresh interpreter: import, warm up `variant` (compile or load), print one JSON line."""
    started = time.perf_counter()
    excl: dict[tuple[str, str], float] = collections.defaultdict(float)
    sigs: dict[str, set[str]] = collections.defaultdict(set)
    if profile:
        _listen(excl, sigs)
    import numba

    import replay.run
    from replay import _numba_cache
    from replay.engine import prebuild

    if not helper:
        prebuild._cores = lambda: 1  # the compile in one process, as on a 1-core machine
    imported = time.perf_counter()
    cold = not _numba_cache.kernels_cached(variant)
    cpu = time.process_time()
    replay.run.warm_up(variant=variant)
    out = {"cold": cold, "import_s": imported - started, "warm_up_s": time.perf_counter() - imported,
           "warm_up_cpu_s": time.process_time() - cpu,
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if cold:  # CPU seconds along the longest chain, a helper's included (replay/_numba_cache.py)
        marker = os.path.join(numba.config.CACHE_DIR, f"compiled-{variant}.json")
        out["chain_cpu_s"] = json.loads(open(marker).read())["compile_cpu_s"]
    if profile:
        by_func: dict[str, float] = collections.defaultdict(float)
        by_pass: dict[str, float] = collections.defaultdict(float)
        for (pass_name, func), seconds in excl.items():
            by_func[func] += seconds
            by_pass[pass_name] += seconds
        out["by_function"] = sorted(by_func.items(), key=lambda kv: -kv[1])[:25]
        out["signatures"] = sum(len(s) for s in sigs.values())
        out["by_pass"] = sorted(by_pass.items(), key=lambda kv: -kv[1])[:8]
        out["twice"] = {name: len(s) for name, s in sigs.items() if len(s) > 1 and not name.startswith("numba.")}
    print(json.dumps(out))


def _listen(excl, sigs) -> None:
    """Exclusive CPU seconds per (pass, function) and the signatures of every compile."""
    from numba.core import event

    stack: list[list] = []

    class Listener(event.Listener):
        def on_start(self, ev):
            stack.append([time.process_time(), 0.0])

        def on_end(self, ev):
            began, inner = stack.pop()
            took = time.process_time() - began
            if stack:
                stack[-1][1] += took
            if ev.kind == "numba:run_pass":
                name, _, func = ev.data["name"].partition(" [")
                excl[(name, func.rstrip("]"))] += took - inner
            else:
                py = ev.data["dispatcher"].py_func
                sigs[f"{py.__module__}.{py.__qualname__}"].add(str(ev.data["args"]))

    listener = Listener()
    event.register("numba:run_pass", listener)
    event.register("numba:compile", listener)


def run_child(cache: str, profile: bool, variant: str, helper: bool = True) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache}
    cmd = [sys.executable, __file__, "--child", "--variant", variant] + (["--profile"] if profile else [])
    cmd += [] if helper else ["--no-helper"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


_COMMAND = """
import resource, sys
from llm_replay.entry import main
try:
    code = main()
finally:
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, file=sys.stderr)
sys.exit(code)
"""


def quick_start(cache: str) -> tuple[float, float]:
    """The README's Quick start replay as a whole command on a warm cache: wall s, peak RSS MB."""
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", _COMMAND, "run", "--out", os.path.join(out, "run"), "-q"],
                              env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        return time.perf_counter() - started, float(done.stderr.strip().splitlines()[-1])


# The command, and its CPU seconds: its own, and a helper's beyond them (engine/prebuild.py; the
# figure the compile's marker adds to this process's, replay/_numba_cache.py `mark_compiled`).
_TIMED_COMMAND = """
import resource, sys
from replay import _numba_cache
from llm_replay.entry import main

def mark_compiled(seconds, cpu_seconds=None, variant="plain", _mark=_numba_cache.mark_compiled):
    print("helper", _numba_cache.HELPER_CPU_S.get(variant, 0.0), file=sys.stderr)
    return _mark(seconds, cpu_seconds, variant)

_numba_cache.mark_compiled = mark_compiled
try:
    code = main()
finally:
    use = resource.getrusage(resource.RUSAGE_SELF)
    print("cpu", use.ru_utime + use.ru_stime, file=sys.stderr)
sys.exit(code)
"""


def first_run(checkout: str | None, cores: int | None) -> dict:
    """The Quick start's command on an empty cache, then on the cache it filled."""
    import re

    out = {}
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as runs:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}  # stderr is a pipe: the notice as in a log
        if checkout:  # its packages before this checkout's (an editable install's finder comes last)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, (checkout, env.get("PYTHONPATH"))))
        pin = ["taskset", "-c", "0"] if cores == 1 else []
        for name in ("cold", "cached"):
            started = time.perf_counter()
            done = subprocess.run([*pin, sys.executable, "-c", _TIMED_COMMAND, "run", "--out", os.path.join(runs, name)],
                                  env=env, cwd=checkout or None, capture_output=True, text=True, check=True)
            wall = time.perf_counter() - started
            err = done.stderr
            out[name] = wall
            if name == "cold":
                notice = re.search(r"about (\d+) s", err)
                took = re.search(r"compiled the engine in (\d+) s", err)
                cpu = float(re.findall(r"^cpu (\S+)$", err, re.M)[-1])
                helper = float(re.findall(r"^helper (\S+)$", err, re.M)[-1])
                marker = [os.path.join(d, "compiled-plain.json") for d in os.listdir(cache) if d.startswith("kernels-")]
                out.update(estimate=float(notice.group(1)) if notice else float("nan"),
                           compile=float(took.group(1)) if took else float("nan"),
                           compile_chain=json.loads(open(os.path.join(cache, marker[0])).read())["compile_cpu_s"],
                           chain=cpu + helper, cpu=cpu, load=os.getloadavg()[0])
    return out


def commands(n: int, cores: int | None, baseline: str | None) -> None:
    """--command: the cold Quick start, n times (alternated with --baseline's checkout)."""
    checkouts = [None] + ([os.path.abspath(baseline)] if baseline else [])
    rows: dict = {c: [] for c in checkouts}
    for _ in range(n):
        for checkout in checkouts:
            got = first_run(checkout, cores)
            rows[checkout].append(got)
            print(f"{checkout or 'this checkout'}: first `llm-replay run` {got['cold']:.1f} s wall (notice: about "
                  f"{got['estimate']:.0f} s; compiled in {got['compile']:.0f} s, {got['compile_chain']:.1f} s CPU along "
                  f"its chain), {got['chain']:.1f} s CPU along the command's longest chain ({got['cpu']:.1f} s in its "
                  f"own process) | cached {got['cached']:.2f} s | "
                  f"load {got['load']:.1f}", flush=True)
    for checkout, got in rows.items():
        med = {k: statistics.median(r[k] for r in got) for k in got[0]}
        print(f"{checkout or 'this checkout'}, median of {len(got)}{' on one core' if cores == 1 else ''}: first run "
              f"{med['cold']:.1f} s wall, {med['chain']:.1f} s CPU along the chain, notice about {med['estimate']:.0f} s "
              f"for a compile of {med['compile']:.0f} s; cached {med['cached']:.2f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cold", type=int, default=2, help="cold compiles to time (each in its own empty cache)")
    ap.add_argument("--profile", action="store_true", help="where the cold compile's CPU time goes")
    ap.add_argument("--variant", choices=("plain", "full"), default="plain",
                    help="the kernel variant to compile (replay/engine/variants.py): plain is the Quick start's")
    ap.add_argument("--helper", choices=("on", "off", "both"), default="on",
                    help="compile advance_nb's callees in a second process (engine/prebuild.py); both: "
                         "alternate cold compiles with and without")
    ap.add_argument("--command", type=int, default=0, metavar="N",
                    help="time the Quick start's first `llm-replay run` (an empty cache) N times instead")
    ap.add_argument("--cores", type=int, choices=(1,), help="with --command: on one core (taskset)")
    ap.add_argument("--baseline", metavar="DIR", help="with --command: alternate with the checkout in DIR")
    ap.add_argument("--no-helper", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.profile, args.variant, not args.no_helper)
        return 0
    print(f"variant {args.variant}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    if args.command:
        commands(args.command, args.cores, args.baseline)
        print(f"load average now {os.getloadavg()[0]:.1f}")
        return 0
    modes = {"on": [True], "off": [False], "both": [True, False]}[args.helper]
    rows: dict[bool, list] = {mode: [] for mode in modes}
    for i in range(args.cold * len(modes)):
        helper = modes[i % len(modes)]
        with tempfile.TemporaryDirectory() as cache:
            cold = run_child(cache, args.profile and i == 0, args.variant, helper)
            warm = run_child(cache, False, args.variant)
            # the Quick start runs the plain variant: on a cache of the full one it would compile
            command_s, command_rss = quick_start(cache) if args.variant == "plain" else (float("nan"), float("nan"))
        rows[helper].append((cold["warm_up_s"], cold["warm_up_cpu_s"], cold.get("chain_cpu_s", float("nan")),
                             warm["warm_up_s"], command_s))
        print(f"{'helper' if helper else 'one process'}: cold compile {cold['warm_up_s']:6.1f} s wall "
              f"({cold['warm_up_cpu_s']:.1f} s CPU here, {cold.get('chain_cpu_s', float('nan')):.1f} s along the "
              f"longest chain), peak RSS {cold['peak_rss_mb']:.0f} MB | cached load {warm['warm_up_s']:.2f} s, "
              f"peak RSS {warm['peak_rss_mb']:.0f} MB | `llm-replay run` cached {command_s:.2f} s, peak RSS "
              f"{command_rss:.0f} MB | load {os.getloadavg()[0]:.1f}", flush=True)
        if "by_function" in cold:
            print("  CPU s by function (exclusive):", ", ".join(f"{f} {s:.1f}" for f, s in cold["by_function"]))
            print("  CPU s by pass:", ", ".join(f"{p} {s:.1f}" for p, s in cold["by_pass"]))
            print(f"  {cold['signatures']} signatures compiled; for more than one:", cold["twice"] or "none")
    for helper, got in rows.items():
        wall, cpu, chain, load, command = (statistics.median(column) for column in zip(*got))
        print(f"{'helper' if helper else 'one process'}, median of {len(got)}: cold compile {wall:.1f} s wall "
              f"({cpu:.1f} s CPU here, {chain:.1f} s along the longest chain), cached load {load:.2f} s, "
              f"`llm-replay run` cached {command:.2f} s")
    print(f"load average now {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
