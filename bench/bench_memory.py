"""Where a big replay's memory goes: wall time and peak RSS per phase, and per million requests.

    python bench/bench_memory.py                        # 1M and 5M Poisson requests (synthesized in /tmp)
    python bench/bench_memory.py TRACE [TRACE ...]      # any trace files (Parquet, CSV with --column-map)
    python bench/bench_memory.py --requests 1000000 --replicas 64

Each trace is replayed in a fresh process of its own (so its peaks are its own) on 64 x
llama-3.1-8b (H100), the run written to a temporary directory with `write_run`, as `llm-replay
run` does. The phases are marked by wrapping the pipeline's own functions (nothing of the
pipeline is copied here):

  load_trace      the file read into the canonical frame (traces.load_trace)
  plan            pools planned, requests split between them
  build_inputs    the engine's input arrays (replay.fleet.cluster.build_inputs)
  engine_init     the engine's state (make_engine)
  replay          every tick: the engine advancing, snapshots, events, control
  collect         the ticks' rows stacked into arrays, the engine's per-request columns
  request_rows, tick_frame, event_frame, summarize    the output frames (replay.fleet.metrics; the numba
                                                      engine's request rows are made during `replay`)
  write           the run directory written and swapped into place (replay.outputs.write)

A phase's peak is exact, not sampled: the kernel's high-water mark (VmHWM) is reset at the start
of each phase (`/proc/self/clear_refs`, value 5, Linux 4.0+) and read at its end. "held" is the RSS
when the phase ends. Peaks are of the whole process (the interpreter, numba and the kernels are in
every row: see the baseline line); "per 1M" divides the growth over the baseline by the trace's
requests in millions: the figure `llm-replay run --max-memory` estimates from (replay/memory.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MB = 1 << 20


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as fh:
        return int(re.search(rf"^{field}:\s+(\d+) kB", fh.read(), re.M).group(1))


class Phases:
    """The current phase; `enter` closes it (wall, peak, held RSS) and starts the next."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.name: str | None = None
        self.began = 0.0

    def enter(self, name: str | None) -> None:
        now = time.perf_counter()
        if self.name is not None:
            self.rows.append({"phase": self.name, "wall_s": now - self.began,
                              "peak_mb": _status_kb("VmHWM") / 1024, "held_mb": _status_kb("VmRSS") / 1024})
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # the peak starts again from the RSS of now
        self.name, self.began = name, time.perf_counter()


def _wrap(module, attr: str, phases: Phases, before: str | None = None, after: str | None = None) -> None:
    inner = getattr(module, attr)

    def wrapped(*args, **kwargs):
        if before:
            phases.enter(before)
        out = inner(*args, **kwargs)
        if after:
            phases.enter(after)
        return out

    setattr(module, attr, wrapped)


def measure(trace_path: str, replicas: int, column_map: dict | None) -> dict:
    """One trace, in this process: the phases' rows and the baseline."""
    import replay.fleet.cluster as cluster
    import replay.run as run
    from bench.bench_replay import fleet
    from replay.fleet.tickloop import TickLoop
    from replay.outputs.write import write_run
    from traces import load_trace

    run.warm_up()  # compile or load the kernels: before the baseline
    phases = Phases()
    baseline_mb = _status_kb("VmRSS") / 1024
    _wrap(cluster, "split_requests", phases, before="plan")
    _wrap(cluster, "build_inputs", phases, before="build_inputs", after="engine_init")
    _wrap(cluster, "make_engine", phases, after="replay")
    _wrap(TickLoop, "tick_arrays", phases, before="collect")  # a method: wrapped on the class
    for name in ("request_rows", "tick_frame", "event_frame", "summarize"):  # request_rows: engines that keep columns
        _wrap(run, name, phases, before=name)
    began = time.perf_counter()
    phases.enter("load_trace")
    trace = load_trace(trace_path, column_map=column_map) if column_map else load_trace(trace_path)
    result = run.replay_trace(trace, fleet("llama-3.1-8b", replicas=replicas))
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        phases.enter("write")
        write_run(Path(tmp) / "run", result)
        phases.enter(None)
    return {"trace": trace_path, "requests": trace.frame.height, "ticks": result.ticks.height,
            "events": result.events.height, "baseline_mb": baseline_mb, "wall_s": time.perf_counter() - began,
            "phases": phases.rows}


def synthesize(requests: int, folder: Path) -> Path:
    """A Poisson trace of about `requests` at 100 req/s with Azure conv lengths (`llm-replay synth`)."""
    out = folder / f"poisson-{requests}.parquet"
    if out.exists():
        return out
    spec = folder / f"poisson-{requests}.yaml"
    spec.write_text(f"seed: 1\nduration_s: {requests / 100:.0f}\nmax_requests: {2 * requests}\nworkloads:\n"
                    "  - name: conv\n    arrival: {process: poisson, rate: 100.0}\n"
                    "    prompt: {dist: empirical, trace: azure-conv-2023, column: prompt_tokens}\n"
                    "    output: {dist: empirical, trace: azure-conv-2023, column: output_tokens}\n")
    subprocess.run([sys.executable, "-m", "llm_replay", "synth", str(spec), "--out", str(out)], check=True,
                   cwd=ROOT)
    return out


def report(m: dict) -> None:
    millions = m["requests"] / 1e6
    print(f"{m['trace']}: {m['requests']:,} requests, {m['ticks']:,} tick rows, {m['events']:,} events; "
          f"wall {m['wall_s']:.1f} s; baseline (interpreter, numba, kernels) {m['baseline_mb']:,.0f} MB")
    print(f"  {'phase':<14}{'wall s':>8}{'peak MB':>9}{'held MB':>9}{'peak-base per 1M':>18}")
    for row in m["phases"]:
        grown = (row["peak_mb"] - m["baseline_mb"]) / millions
        print(f"  {row['phase']:<14}{row['wall_s']:>8.2f}{row['peak_mb']:>9,.0f}{row['held_mb']:>9,.0f}"
              f"{grown:>15,.0f} MB")
    top = max(m["phases"], key=lambda r: r["peak_mb"])
    per_request = (top["peak_mb"] - m["baseline_mb"]) * MB / m["requests"]
    print(f"  peak {top['peak_mb']:,.0f} MB in {top['phase']}: {per_request:,.0f} bytes per request over the baseline")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="*", help="trace files (default: 1M and 5M synthesized Poisson requests)")
    ap.add_argument("--requests", type=int, nargs="*", default=[1_000_000, 5_000_000])
    ap.add_argument("--replicas", type=int, default=64)
    ap.add_argument("--column-map", help="JSON column map for CSV/JSONL traces, e.g. "
                    '\'{"arrival": "ts", "prompt_tokens": "inp", "output_tokens": "out"}\'')
    ap.add_argument("--json", action="store_true", help="also print each measurement as one JSON line")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # the child: measure this trace, print JSON
    args = ap.parse_args()
    column_map = json.loads(args.column_map) if args.column_map else None
    if args.one:
        print(json.dumps(measure(args.one, args.replicas, column_map)))
        return 0
    os.environ.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".numba_cache"))
    folder = Path(tempfile.gettempdir()) / "llm-replay-bench-memory"
    folder.mkdir(exist_ok=True)
    paths = args.traces or [str(synthesize(n, folder)) for n in args.requests]
    for path in paths:
        child = [sys.executable, __file__, "--one", path, "--replicas", str(args.replicas)]
        if args.column_map:
            child += ["--column-map", args.column_map]
        out = subprocess.run(child, check=True, capture_output=True, text=True).stdout
        m = json.loads(out.strip().splitlines()[-1])
        report(m)
        if args.json:
            print(json.dumps(m))
    return 0


if __name__ == "__main__":
    sys.exit(main())
