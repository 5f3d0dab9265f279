"""Where one `llm-replay run` spends its time, by phase, in process: each phase's own seconds
(a phase called inside another is counted in the inner one only), its calls, and the whole wall.

    python bench/phases.py run TRACE -c fleet.yaml --quiet --force --out /tmp/run

The phases are the functions below, wrapped (module, attribute, label); `kernel` is the numba
kernels' calls (advance_nb and the rest), every other phase is Python around them. A phase not
reached in a run is not printed; the kernels' warm-up (a replay of three requests, in
`kernels loaded`) counts its own calls of the later phases too (tick_frame's and summarize's 2).
"""

from __future__ import annotations

import importlib
import sys
import time
from collections import defaultdict

PHASES = (
    ("replay.cli.run", "prepare_run", "config, fleet, --out checks"),
    ("replay.memory", "check_fits", "memory estimate"),
    ("traces.loader", "open_batches", "trace check pass"),
    ("replay.outputs.report", "engine_ready", "kernels loaded (numba cache)"),
    ("replay.fleet.streamed", "StreamedRequests._last_arrival", "last arrival (trace's tail)"),
    ("replay.fleet.streamed", "StreamedRequests._next_batch", "batches read for the window"),
    ("replay.fleet.streamed", "StreamedRequests.slice", "batches read for the rows"),
    ("replay.engine.numba_engine", "NumbaEngine._kernel", "kernel (advance_nb, release_held)"),
    ("replay.engine.numba_engine", "NumbaEngine._drain", "event buffer drained"),
    ("replay.engine.window", "Window.fill", "window: fill"),
    ("replay.engine.window", "Window.slide", "window: slide"),
    ("replay.fleet.request_rows", "RowMaker.frame", "request rows made"),
    ("replay.outputs.rows", "RequestRows.append", "request rows kept/spilled"),
    ("replay.engine.numba_engine", "NumbaEngine.snapshot", "tick: snapshot"),
    ("replay.fleet.control", "FleetControl.tick", "tick: control plane"),
    ("replay.fleet.tickloop", "TickLoop.tick", "tick: loop's own"),
    ("replay.fleet.tickloop", "TickLoop.run", "tick loop (rest)"),
    ("replay.run", "tick_frame", "tick_frame"),
    ("replay.run", "figure_rows", "figure_rows"),
    ("replay.run", "summarize", "summarize"),
    ("replay.run", "event_frame", "event_frame"),
    ("replay.outputs.write", "write_run", "write_run"),
)

own = defaultdict(float)
calls = defaultdict(int)
stack: list[list] = []  # [label, start, time spent in phases inside it]


def wrap(owner, name: str, label: str) -> None:
    fn = getattr(owner, name, None)
    if fn is None:  # a phase this version of the code does not have
        return

    def timed(*a, **k):
        stack.append([label, time.perf_counter(), 0.0])
        try:
            return fn(*a, **k)
        finally:
            _, began, inner = stack.pop()
            spent = time.perf_counter() - began
            own[label] += spent - inner
            calls[label] += 1
            if stack:
                stack[-1][2] += spent

    setattr(owner, name, timed)


def install() -> None:
    for module, attr, label in PHASES:
        owner = importlib.import_module(module)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        wrap(owner, name, label)


def report(wall: float) -> None:
    print(f"wall {wall:.1f} s", file=sys.stderr)
    for _, _, label in PHASES:
        if calls[label]:
            print(f"  {label:36s} {own[label]:8.2f} s {100 * own[label] / wall:5.1f}%  ({calls[label]:,} calls)",
                  file=sys.stderr)
    rest = wall - sum(own.values())
    print(f"  {'(outside every phase)':36s} {rest:8.2f} s {100 * rest / wall:5.1f}%", file=sys.stderr)


def main() -> int:
    install()
    from replay.cli.app import main as cli

    began = time.perf_counter()
    try:
        return cli(sys.argv[1:])
    finally:
        report(time.perf_counter() - began)


if __name__ == "__main__":
    sys.exit(main())
