"""A production day on one machine: ServeGen's m-large language mix replayed on an autoscaled fleet
with `llm-replay run`, timed whole (trace read, replay, run directory written) in a fresh process,
with its peak RSS; optionally the step-by-step engine (`numba-eager`) on the same trace for the ratio.

    python bench/bench_day.py                      # the whole day (~24 M requests at ~280 req/s)
    python bench/bench_day.py --hours 1 --eager    # its first hour, both engines, the ratio
    python bench/bench_day.py --hours 2 --repeats 3
    python bench/bench_day.py --mix m-mid           # ServeGen m-mid: ~155 M requests
    python bench/bench_day.py --hours 4 --whole     # also the trace read whole, not in batches
    python bench/bench_day.py --hours 4 --phases    # and where the run's time goes (bench/phases.py)

The trace is synthesized once per (mix, hours, start day), an hour at a time, with `llm-replay synth`'s ServeGen reader (all
162 clients' fitted 10-minute windows; lengths from the bundled Azure conversation trace, since
ServeGen's language folders hold none) and kept in /tmp/llm-replay-bench. The fleet is
llama-3.1-8b on H100s under Knative's KPA (concurrency 32 a replica, 4 to 160 replicas). Each run
is a child process; its peak RSS is the kernel's for that child alone (os.wait4). Kernels come from
numba's cache (a warm-up run on a small trace first). Machines are shared: quote medians.

The trace is canonical Parquet, so `llm-replay run` reads it in batches as the replay goes
(traces/stream.py); `--whole` also replays it the way every other trace is, its frame read whole
first (the same run files), for the memory and time that streaming saves.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_SERVEGEN = ROOT.parent / "shared" / "traces" / "servegen"
CACHE = Path(tempfile.gettempdir()) / "llm-replay-bench"
FLEET_YAML = """model: llama-3.1-8b
gpu: h100-sxm-80gb
pools:
  - name: default
    replicas: 16
    tensor_parallel_size: 1
    autoscaler:
      policy: kpa
      min_replicas: 4
      max_replicas: 160
      params: {container_concurrency: 32}
    lifecycle: {pod_start_s: 60}
"""


def _synth_hour(folder: Path, mix: str, start_s: float, seconds: float, seed: int):
    from traces.synth import parse_spec, synthesize

    return synthesize(parse_spec({
        "seed": seed, "duration_s": seconds,
        "workloads": [{"name": mix, "servegen": {"path": str(folder), "start_s": start_s},
                       "prompt": {"dist": "empirical", "trace": "azure-conv-2023", "column": "prompt_tokens"},
                       "output": {"dist": "empirical", "trace": "azure-conv-2023", "column": "output_tokens"}}],
    }, "bench_day"))


def day_trace(servegen: Path, mix: str, hours: float, start_day: int) -> Path:
    """The synthesized trace's Parquet, made once, an hour at a time so that a day of m-mid's
    ~155 M requests is made in bounded memory: hour h is its own synthesis (seed h, ServeGen's
    windows from the day's hour h on), its arrivals shifted by h hours and its ids by the rows
    before it; the hours are then streamed into one file (polars' sink, no whole frame)."""
    out = CACHE / f"{mix}-{hours:g}h-day{start_day}.parquet"
    if out.exists():
        return out
    import polars as pl

    from traces.canonical import BLOCK_KEY, write_canonical

    folder = servegen / "language" / mix
    if not folder.is_dir():
        sys.exit(f"bench_day: no ServeGen {mix} folder at {folder} (pass --servegen)")
    began = time.perf_counter()
    CACHE.mkdir(exist_ok=True)
    parts, metadata = [], None
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        for h in range(max(1, -int(-hours // 1))):
            trace = _synth_hour(folder, mix, start_day * 86400 + h * 3600, min(3600.0, hours * 3600 - h * 3600), h)
            part = Path(tmp, f"{h:03d}.parquet")
            write_canonical(trace.frame, part, trace.prefix_block_tokens)
            if trace.prefix_block_tokens:
                metadata = {BLOCK_KEY: str(trace.prefix_block_tokens)}
            parts.append((part, trace.frame.height, h * 3600 * 1_000_000))
            del trace
        ids = 0
        frames = []
        for part, rows, shift_us in parts:
            frames.append(pl.scan_parquet(part).with_columns(pl.col("request_id") + ids, pl.col("arrival_us") + shift_us))
            ids += rows
        staged = Path(tmp, "day.parquet")
        pl.concat(frames).sink_parquet(staged, metadata=metadata, statistics=False)
        os.replace(staged, out)
    print(f"synthesized {ids:,} requests in {time.perf_counter() - began:.0f} s -> {out}")
    return out


def child(argv: list[str]) -> tuple[float, float]:
    """Run a child to completion: (wall seconds, its peak RSS in MB)."""
    began = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - began
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"bench_day: {' '.join(argv)} exited {proc.returncode}")
    return wall, usage.ru_maxrss / 1024


def run_once(engine: str, trace: Path, config: Path, out: Path) -> tuple[float, float]:
    """`llm-replay run` as a user types it (the numba engine), or the same command line on the
    internal step-by-step engine (which the CLI does not offer), or (`numba-whole`) with the
    trace read whole, not in batches."""
    # (m-mid's day is more rows than the loader's default bound of 30 M)
    argv = ["run", str(trace), "-c", str(config), "--quiet", "--force", "--out", str(out), "--max-memory", "20GiB",
            "--max-rows", str(1 << 30)]
    if engine == "numba":
        return child([str(Path(sys.executable).with_name("llm-replay")), *argv])
    return child([sys.executable, __file__, "--child-engine", engine, *argv])


def as_engine(engine: str, argv: list[str]) -> int:
    """The CLI's own run command with `engine` in place of --engine's choice (`numba-whole`: the
    numba engine on the trace's frame read whole)."""
    from replay.cli.app import COMMANDS, build_parser

    if engine == "numba-whole":
        import replay.fleet.streamed

        replay.fleet.streamed.replays_in_batches = lambda *_a, **_k: False
        engine = "numba"
    args = build_parser().parse_args(argv)
    args.engine = engine
    return COMMANDS[args.command].run(args)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servegen", type=Path, default=DEFAULT_SERVEGEN)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--mix", choices=("m-large", "m-mid", "m-small"), default="m-large",
                    help="ServeGen's language mix (m-large ~24 M requests a day, m-mid ~155 M)")
    ap.add_argument("--start-day", type=int, default=0, help="which of the data's 14 days")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--eager", action="store_true", help="also the step-by-step engine, for the ratio")
    ap.add_argument("--whole", action="store_true", help="also the trace read whole, not in batches")
    ap.add_argument("--phases", action="store_true",
                    help="then one more run, in process, timed by phase (bench/phases.py), its table printed")
    ap.add_argument("--child-engine", default=None, help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args()
    if args.child_engine:
        return as_engine(args.child_engine, rest)
    trace = day_trace(args.servegen, args.mix, args.hours, args.start_day)
    import polars as pl

    rows = pl.scan_parquet(trace).select(pl.len()).collect().item()
    engines = ("numba",) + ("numba-eager",) * args.eager + ("numba-whole",) * args.whole
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp, "fleet.yaml")
        config.write_text(FLEET_YAML)
        for engine in engines:  # kernels from numba's cache, or compiled here, not timed
            run_once(engine, Path("azure-conv-2023"), config, Path(tmp, "warm"))
        results = {}
        for engine in engines:
            runs = [run_once(engine, trace, config, Path(tmp, f"run-{engine}")) for _ in range(args.repeats)]
            results[engine] = (statistics.median(w for w, _ in runs), max(m for _, m in runs))
    load = os.getloadavg()[0]
    print(f"ServeGen {args.mix}, {args.hours:g} h from day {args.start_day}: {rows:,} requests "
          f"({rows / (args.hours * 3600):,.0f} req/s) on llama-3.1-8b / H100 under KPA (4-160 replicas); load {load:.1f}")
    for engine, (wall, peak) in results.items():
        print(f"  {engine:12s} whole `llm-replay run`: {wall:,.1f} s (median of {args.repeats}), "
              f"peak RSS {peak:,.0f} MB, {rows / wall / 1e3:,.0f} k requests/s")
    if args.eager:
        print(f"  ratio eager / numba: {results['numba-eager'][0] / results['numba'][0]:.2f}x")
    if args.whole:
        (wall, peak), (whole_wall, whole_peak) = results["numba"], results["numba-whole"]
        print(f"  read whole / in batches: {whole_wall / wall:.2f}x the time, {whole_peak / peak:.2f}x the peak RSS")
    if args.phases:
        with tempfile.TemporaryDirectory() as tmp:
            config = Path(tmp, "fleet.yaml")
            config.write_text(FLEET_YAML)
            argv = ["run", str(trace), "-c", str(config), "--quiet", "--force", "--out", str(Path(tmp, "run")),
                    "--max-memory", "20GiB", "--max-rows", str(1 << 30)]
            subprocess.run([sys.executable, str(Path(__file__).with_name("phases.py")), *argv], check=True,
                           stdout=subprocess.DEVNULL)  # its table goes to stderr
    return 0


if __name__ == "__main__":
    sys.exit(main())
