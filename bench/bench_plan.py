"""`plan` on the bundled trace: the default fleet's model (llama-3.1-70b) over 3 GPUs x 4 TPs x 2
precisions, at the default SLO (TTFT 2 s, TPOT 100 ms, 99%). Prints, per run, the wall time
(numba's cache warm: compiling is not the plan's cost), the replays it needed and the winner;
then the median and the peak RSS of this process and of its workers.

    python bench/bench_plan.py [--workers N] [--repeats 3]

Each run starts a fresh worker pool, so the workers' start-up (a spawn and a cache load each) is
in the time, as it is for a user.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replay.config import FleetConfig  # noqa: E402
from replay.plan.driver import default_workers, executor  # noqa: E402
from replay.plan.plan import make_plan  # noqa: E402
from replay.plan.space import build_space  # noqa: E402
from replay.run import warm_up  # noqa: E402
from traces import DEFAULT_TRACE, load_trace  # noqa: E402

GPUS = ["h100-sxm-80gb", "h200-sxm-141gb", "a100-sxm-80gb"]
TPS = [1, 2, 4, 8]
PRECISIONS = [None, "fp8"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=None, help="default: one per core")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    trace = load_trace(DEFAULT_TRACE)
    space = build_space(None, 0.99, GPUS, TPS, PRECISIONS, 64)
    workers = args.workers or default_workers(len(space.candidates))
    warm_up()
    print(f"plan on {DEFAULT_TRACE} ({trace.frame.height:,} requests): {len(space.candidates)} candidates, "
          f"{workers} workers")
    times = []
    for i in range(args.repeats):
        started = time.perf_counter()
        with executor(trace, workers, [], "numba") as pool:
            plan = make_plan(FleetConfig(), space, pool, "numba")
        times.append(time.perf_counter() - started)
        w = plan.winner
        print(f"  run {i + 1}: {times[-1]:6.1f} s, {plan.replays} replays, winner "
              f"{w.label if w else None}: {', '.join(f'{p}: {n}' for p, (_, n) in w.choice.items()) if w else ''}"
              f" ${w.summary['cost_usd']:.2f}, attainment {w.summary['slo_attainment']:.4f}" if w else "")
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"median {statistics.median(times):.1f} s over {len(times)} runs; peak RSS {own:,.0f} MB here, "
          f"{children:,.0f} MB in the largest worker")


if __name__ == "__main__":
    main()
