"""`llm-replay sweep SWEEP.yaml --out DIR`: one replay per cell of a grid over config keys, on
every local core or a Ray cluster; resumable; one results.parquet (replay/sweep/)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from common.errors import UserError
from replay.cli.parsing import add_plugin_option


def add_parser(sub: Any) -> None:
    p = sub.add_parser("sweep", help="replay a grid (or a sample) of configs; one results table")
    p.add_argument("spec", metavar="SWEEP.yaml", help="base config, trace and grid (README: Sweeps)")
    p.add_argument("--out", "-o", required=True,
                   help="folder for the results (a re-run resumes it: finished cells are not replayed again)")
    p.add_argument("--backend", choices=("local", "ray"), default="local",
                   help="local worker processes (default), or a Ray cluster (pip install 'llm-replay[ray]')")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="cells at a time (default: the CPU cores; with ray and no --address, the local cluster's CPUs)")
    p.add_argument("--address", metavar="ADDR", help="--backend ray: the cluster's HOST:PORT (default: start a local one)")
    p.add_argument("--keep-runs", action="store_true", help="also keep each cell's run directory in OUT/runs/CELL")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress and no closing summary")
    add_plugin_option(p)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from replay.outputs.rundir import locked
    from replay.sweep import build_cells, read_spec, run_cells, store
    from replay.sweep.progress import sweep_progress

    workers = args.workers if args.workers is not None else (os.cpu_count() or 1)
    if workers < 1:
        raise UserError(f"--workers: got {workers}, expected a whole number >= 1")
    from replay.sweep.ray_backend import check_backend

    check_backend(args.backend, args.address)  # before any cell is built
    from policies.plugins import load_plugins

    load_plugins(args.plugin)
    out = Path(args.out)
    store.check_sweep_dir(out)
    spec = read_spec(args.spec)
    cells, traces = build_cells(spec)  # every cell's config and trace checked before one runs
    console = Console(stderr=True)
    if args.backend != "ray":  # local workers share this machine's numba cache: compiled here once
        from replay.outputs.report import engine_ready
        from replay.run import fleet_variants

        for variant in fleet_variants((c.cfg, spec.source) for c in cells):
            engine_ready(console, terminal=console.is_terminal, quiet=args.quiet, variant=variant)
    mode = "off" if args.quiet else ("bar" if console.is_terminal else "lines")
    with locked(out):
        store.check_sweep_dir(out)  # again, under the lock
        try:
            result = run_cells(spec, cells, traces, out, backend=args.backend, workers=workers,
                               address=args.address, keep_runs=args.keep_runs, plugins=args.plugin,
                               progress=lambda total: sweep_progress(console, total, mode))
        except KeyboardInterrupt:
            done = sum(store.is_done(out, c, args.keep_runs) for c in cells)
            console.print(f"llm-replay: sweep: stopped; {done} of {len(cells)} cells are finished and kept in "
                          f"{out}; run the same command again to finish the rest", soft_wrap=True, highlight=False)
            raise
    if not args.quiet:
        before = f", {result.skipped} done before" if result.skipped else ""
        failed = f", {result.failed} failed (see the error column)" if result.failed else ""
        print(f"sweep: {result.cells} cells ({result.ran} replayed{before}{failed}) -> {result.results}")
    return 0
