"""Opening a big run in the dashboard, and showing its requests: wall time and peak RSS, this
checkout against another.

    python bench/bench_tui_open.py                                   # 5M requests, this checkout
    python bench/bench_tui_open.py --requests 20000000 --pools 1     # a day's 20M on one pool
    python bench/bench_tui_open.py --baseline /tmp/base              # and another checkout, same run
    git archive BASE | tar -x -C /tmp/base                           # (how to make one)
    python bench/bench_tui_open.py --what worst,life                 # only the request views
    python bench/bench_tui_open.py --what workload,replicas,observed # the review views, the overlay

The run is bench/bench_tui.py's synthetic day (86,400 ticks x `--pools` pools) with `--requests`
requests (requests.parquet of the writer's schema), written once under /tmp/llm-replay-bench-tui-open. Each figure
(`--what`, all four by default) is a median over `--repeat` fresh processes (so each peak is that
process's own):

- load: `tui.data.load_run` in a process that imported the dashboard first (peak = its high-water
  mark, VmHWM; over = peak - RSS after the imports);
- screenshot: `llm-replay tui RUN --screenshot` (imports, load, mount, first frame and SVG), its
  peak from getrusage of that one child;
- worst: in a process that loaded the run, the worst-requests table at mid-day (`d`: the fleet's
  200 worst by TTFT in the window ending there, as cells), its time and the peak over the RSS
  after loading (over);
- life: likewise, one request's life (enter on a row: the request in the middle of the run);
- workload: likewise, the per-workload view at mid-day (`l`: the first workload's chart rows at
  200 columns, their values at the cursor, and the timeline, whose first breach is that
  workload's SLO attainment at every tick);
- replicas: likewise, the replica view of the first pool at mid-day (`r`: each replica's queue,
  running and KV held at the cursor, and its queue over the run);
- observed: in a process that loaded the run and read its observed export (bench/bench_tui.py's
  export of the run, made once beside it, in a directory of hard links to its files), scoring the
  export as the dashboard does once it is up.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDER = Path("/tmp/llm-replay-bench-tui-open")
WHAT = ("load", "screenshot", "worst", "life", "workload", "replicas", "observed")
SHOWN = ("worst", "life", "workload", "replicas")
OVER = {"load": "imports", **dict.fromkeys((*SHOWN, "observed"), "loaded")}  # what a peak is counted over
WIDTH, HEIGHT = 200, 60


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as fh:
        return int(re.search(rf"^{field}:\s+(\d+) kB", fh.read(), re.M).group(1)) / 1024


def load_one(run: str) -> dict:
    from tui.data import load_run

    base = _status_mb("VmRSS")
    began = time.perf_counter()
    data = load_run(run)
    wall = time.perf_counter() - began
    return {"wall_s": wall, "peak_mb": _status_mb("VmHWM"), "over_mb": _status_mb("VmHWM") - base,
            "ticks": len(data.t_us)}


def shown_one(run: str, what: str) -> dict:
    """After loading: at mid-day, the worst-requests table, one request's life, the per-workload
    view or the replica view."""
    from tui.data import FLEET, load_run
    from tui.model import Model
    from tui.panels import metric_rows, timeline_lines
    from tui.requests import columns_of, request_life, request_rows, worst_requests
    from tui.views import WORKLOAD_PREFIX, replica_lines

    data = load_run(run)
    model = Model([data], at_us=data.end_us // 2)
    base = _status_mb("VmRSS")
    began = time.perf_counter()
    if what == "worst":
        shown = len(request_rows(worst_requests(data, data.end_us // 2, FLEET), columns_of(data)))
    elif what == "life":
        shown = len(request_life(data, data.table.height // 2).plain)
    elif what == "workload":
        model.cycle_workload(1)
        assert model.view.scope.startswith(WORKLOAD_PREFIX), model.view.scope
        rows = metric_rows(model, WIDTH, HEIGHT)
        shown = len(rows) + len(timeline_lines(model, WIDTH))
    else:
        shown = len(replica_lines(model, WIDTH, HEIGHT))
    wall = time.perf_counter() - began
    return {"wall_s": wall, "peak_mb": _status_mb("VmHWM"), "over_mb": _status_mb("VmHWM") - base, "shown": shown}


def observed_one(run: str) -> dict:
    """After loading the run and its export: the export scored as the dashboard scores it."""
    import yaml

    import tui.observed as observed
    from tui.data import load_run

    data = load_run(run)
    overlay = observed.load_overlay([str(Path(run) / "observed.json")], data,
                                    yaml.safe_load((Path(run) / "config.yaml").read_text()))
    base = _status_mb("VmRSS")
    began = time.perf_counter()
    if hasattr(observed, "score_data"):
        scored = observed.score_data(overlay, data)
    else:  # a checkout from before score_data: what its dashboard passed
        scored = observed.score_run_dir(overlay, data.path, data.requests)
    wall = time.perf_counter() - began
    assert scored.error is None and scored.section is not None, scored.error
    return {"wall_s": wall, "peak_mb": _status_mb("VmHWM"), "over_mb": _status_mb("VmHWM") - base,
            "signals": len(scored.section["signals"])}


def with_export(run: Path) -> Path:
    """The run beside its observed export: hard links to its files, its config gaining the
    `observed:` section (made once; the run itself is left as it is)."""
    out = run.with_name(run.name + "-observed")
    if (out / "observed.json").exists():
        return out
    from bench.bench_tui import observed_export

    out.mkdir(exist_ok=True)
    for f in run.iterdir():
        if not (out / f.name).exists():
            if f.suffix == ".parquet":
                os.link(f, out / f.name)
            else:
                (out / f.name).write_bytes(f.read_bytes())
    observed_export(out, out)
    return out


def screenshot_one(run: str, root: str) -> dict:
    env = {**os.environ, "PYTHONPATH": root}
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "llm_replay", "tui", run, "--screenshot", str(FOLDER / "s.svg"),
                    "--size", "200x60"], check=True, capture_output=True, cwd=root, env=env)
    return {"wall_s": time.perf_counter() - began,
            "peak_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def measure(run: Path, root: Path, what: str, repeat: int) -> dict:
    rows = []
    for _ in range(repeat):
        env = {**os.environ, "PYTHONPATH": str(root)}
        out = subprocess.run([sys.executable, __file__, "--one", what, "--run", str(run), "--root", str(root)],
                             check=True, capture_output=True, text=True, cwd=root, env=env).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5_000_000)
    ap.add_argument("--pools", type=int, default=4, help="(one pool's series are all its ticks'; a fleet of "
                    "several reads first tokens for its TTFT percentiles)")
    ap.add_argument("--baseline", type=Path, help="another checkout to compare with, on the same run")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--what", default=",".join(WHAT), help="which figures, comma separated")
    ap.add_argument("--one", choices=WHAT, help=argparse.SUPPRESS)
    ap.add_argument("--run", help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not set(args.what.split(",")) <= set(WHAT):
        ap.error(f"--what {args.what}: expected some of {', '.join(WHAT)}, comma separated")
    if args.one:
        sys.path.insert(0, args.root)
        result = (load_one(args.run) if args.one == "load" else screenshot_one(args.run, args.root)
                  if args.one == "screenshot" else observed_one(args.run) if args.one == "observed"
                  else shown_one(args.run, args.one))
        print(json.dumps(result))
        return 0
    FOLDER.mkdir(exist_ok=True)
    run = FOLDER / (f"run-{args.requests}" if args.pools == 4 else f"run-{args.requests}-{args.pools}-pools")
    sys.path.insert(0, str(ROOT))
    if not (run / "config.yaml").exists():
        from bench.bench_tui import synthetic_run

        synthetic_run(run, 86_400, args.pools, args.requests)
    size = sum(f.stat().st_size for f in run.iterdir()) / (1 << 20)
    print(f"run: 86,400 ticks x {args.pools} pools, {args.requests:,} requests ({size:.0f} MB of files); medians of {args.repeat}")
    for what in args.what.split(","):
        target = with_export(run) if what == "observed" else run
        new = measure(target, ROOT, what, args.repeat)
        line = f"{what:<10} new {new['wall_s']:6.2f} s peak {new['peak_mb']:6.0f} MB"
        if "over_mb" in new:
            line += f" (over {OVER[what]} {new['over_mb']:6.0f} MB)"
        if args.baseline:
            old = measure(target, args.baseline, what, args.repeat)
            line += f" | old {old['wall_s']:6.2f} s peak {old['peak_mb']:6.0f} MB"
            if "over_mb" in old:
                line += f" (over {OVER[what]} {old['over_mb']:6.0f} MB)"
            line += f" | new/old time {new['wall_s'] / old['wall_s']:.2f} peak {new['peak_mb'] / old['peak_mb']:.2f}"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
