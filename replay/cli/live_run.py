"""`llm-replay run --tui`: a replay watched while it runs. A child process replays and writes
DIR/live/ (replay/fleet/live.py) and the dashboard follows DIR; the finished run replaces DIR in
one rename. The dashboard is the one the application registered (replay.cli.app.dashboard,
filled by llm_replay/app.py): replay sits below tui and never imports it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from common.errors import UserError


def cmd_run_tui(args: argparse.Namespace) -> int:
    """Check the input before the dashboard starts (config, fleet, --out, the trace itself and
    its split over the pools: a bad one is one line and exit 2, as without --tui), start the
    replay of the loaded trace in a child process, show the dashboard until the user quits;
    quitting before the end stops the replay and leaves nothing behind."""
    import multiprocessing

    import yaml

    from replay.cli.app import dashboard
    from replay.cli.run import prepare_run, report_trace_fixes
    from replay.fleet.split import split_requests
    from replay.fleet.live import LIVE_DIR, STATUS_FILE
    from replay.outputs.write import claimed

    show = dashboard()
    # The trace is read here, not in the child: a bad one fails before the dashboard starts (and
    # before DIR is made). The child replays this very trace (it travels pickled).
    began = time.perf_counter()
    checked = prepare_run(args)
    resolved, source, plans, out, trace = checked.cfg, checked.source, checked.plans, checked.out, checked.trace
    load_s = time.perf_counter() - began
    split_requests(trace.frame, resolved, plans, source)  # a split that strands a request: a config error
    live = out / LIVE_DIR
    with claimed(out, args.force, checked.inputs):  # held while the child replays and writes DIR
        created = not out.exists()
        live.mkdir(parents=True)
        (live / "config.yaml").write_text(yaml.safe_dump(resolved.to_dict(), sort_keys=False))
        _write_status(live, os.getpid())
        # the child scores the export itself (the parent's checked copy does not travel: it needs no pickling)
        proc = multiprocessing.get_context("spawn").Process(target=replay_child, args=(args, str(out), trace, load_s),
                                                            daemon=True)
        proc.start()
        # The writer of live/ is the child from now on: a dashboard that finds it dead stops following.
        _write_status(live, proc.pid)
        try:
            show(out, observed=list(args.observed or []) or None)
        except BaseException:  # SIGTERM (or Ctrl-C) in the parent: stop the replay, leave nothing
            proc.terminate()
            proc.join()
            _clean(out, live, created)
            raise
        finally:
            # The replay ended (the finished run replaced live/, or its failure is recorded) or is
            # writing its run: let the child finish (its exit can take a while on a busy machine);
            # otherwise the user quit early and it stops here.
            ended = (not live.exists() or _status_state(live / STATUS_FILE) == "writing"
                     or _status_error(live / STATUS_FILE) is not None)
            proc.join(timeout=60 if ended else 0.1)
            stopped = proc.is_alive()
            if stopped:
                proc.terminate()
                proc.join()
        if proc.exitcode != 0:
            error = _status_error(live / STATUS_FILE)
            _clean(out, live, created)
    if proc.exitcode == 0:
        from rich.console import Console

        from replay.cli.run import print_observed
        from replay.outputs.report import print_summary

        report_trace_fixes(Console(stderr=True), trace)
        if not args.quiet:  # the tables `run` prints: the dashboard has left the screen
            summary = json.loads((out / "summary.json").read_text())
            print_summary(Console(), summary, out)
            print_observed(Console(), summary)
        else:
            print(f"run written to {out}")
        return 0
    if stopped:
        print("llm-replay: replay stopped before its end; nothing written", file=sys.stderr)
        return 130
    if error is not None:
        raise UserError(error)
    print(f"llm-replay: the replay process failed (exit code {proc.exitcode}); nothing written", file=sys.stderr)
    return 1


def _observed(args: argparse.Namespace, cfg, source: str):
    """--observed read again in the child (the parent checked it before the dashboard started)."""
    if not getattr(args, "observed", None):
        return None
    from replay.cli.observed import read_observed_files

    return read_observed_files(args.observed, cfg.observed, source, [p.name for p in cfg.pools])


def _write_status(live: Path, pid: int) -> None:
    """The status before the first flush, naming the process that writes live/ (replay.outputs.rundir)."""
    from replay.fleet.live import STATUS_FILE, write_atomic
    from replay.outputs.rundir import writer_tag

    pid, start = writer_tag(pid)
    body = {"state": "running", "seq": 0, "done_us": 0, "end_us": 0, "pid": pid, "pid_start": start}
    write_atomic(live / STATUS_FILE, lambda p: p.write_text(json.dumps(body) + "\n"))


def _status_state(path: Path) -> str | None:
    try:
        return json.loads(path.read_text()).get("state")
    except (OSError, ValueError):
        return None


def _status_error(path: Path) -> str | None:
    try:
        return json.loads(path.read_text()).get("error")
    except (OSError, ValueError):
        return None


def _clean(out: Path, live: Path, created: bool) -> None:
    """No partial output directory: drop live/, and DIR when this command made it."""
    shutil.rmtree(live, ignore_errors=True)
    if created and out.is_dir() and not any(out.iterdir()):
        out.rmdir()


def replay_child(args: argparse.Namespace, out: str, trace, load_s: float = 0.0) -> None:
    """The replay of `trace` (loaded and checked by the parent), in its own process so the
    dashboard never waits on it. Prints nothing (the terminal is the dashboard's); an error goes
    to live/status.json and the exit code."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    import dataclasses

    from replay.cli.run import RunInputs, with_observed
    from replay.cli.trace_options import effective_trace
    from replay.fleet.cluster import plan_pools
    from replay.config import load_config
    from replay.fleet.live import LIVE_DIR, STATUS_FILE, LiveWriter, write_atomic
    from replay.outputs.write import write_run
    from replay.run import replay_trace, run_variant, warm_up

    out_dir = Path(out)
    try:
        cfg = load_config(args.config, plugins=args.plugin)
        source = args.config or "default fleet"
        plans = plan_pools(cfg, source)
        base_dir = Path(args.config).resolve().parent if args.config else None
        cfg = dataclasses.replace(cfg, trace=effective_trace(cfg.trace, args, base_dir, absolute=True))
        writer = LiveWriter(out_dir, trace.frame, cfg, plans, source)
        writer.start()
        began = time.perf_counter()
        if args.engine == "numba":
            from replay._numba_cache import compile_estimate_s, kernels_cached

            variant = run_variant(cfg, plans, trace.frame, source)
            if not kernels_cached(variant):  # the dashboard says so while the child compiles
                writer.status("compiling", compile_estimate_s=round(compile_estimate_s(variant)[0]))
            warm_up(variant=variant)
            writer.status("running")
        timing = {"load_trace_s": load_s, "warm_up_s": time.perf_counter() - began}
        result = replay_trace(trace, cfg, engine=args.engine, detailed_events=args.detailed_events,
                              plans=plans, config_source=source, on_tick=writer.on_tick)
        writer.flush()  # the last ticks: the dashboard then holds the whole run and keeps it
        writer.status("writing")
        result, _ = with_observed(result, RunInputs(cfg, source, plans, out_dir, trace, (), _observed(args, cfg, source)))
        write_run(out_dir, result, force=True, timing=timing)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the dashboard
        message = str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"
        status = out_dir / LIVE_DIR / STATUS_FILE
        if status.parent.is_dir():
            try:
                body = json.loads(status.read_text())
            except (OSError, ValueError):
                body = {"seq": 0, "done_us": 0, "end_us": 0}
            body.update(state="failed", error=message)
            write_atomic(status, lambda p: p.write_text(json.dumps(body) + "\n"))
        sys.exit(2 if isinstance(exc, UserError) else 1)
