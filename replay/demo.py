"""`llm-replay demo incident`: the reference lesson's incident, replayed before and after the fix.

Both fleets are plain config files shipped in `replay/demos/` (copied into each run directory as
its config.yaml), so the demo is a replay like any other and its numbers can be reproduced with
`llm-replay run -c replay/demos/incident-before.yaml`.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from common.errors import UserError
from replay.fleet.cluster import plan_pools
from replay.config import FleetConfig, load_config
from replay.outputs.write import RunOutputs, check_out_dir, claimed, existing_out_dir, write_run
from replay.run import replay_trace
from replay.outputs.rundir import LEFTOVER
from traces import load_from_config

SCENARIOS = ("before", "after")


def demo_config_path(name: str) -> Path:
    return Path(__file__).resolve().parent / "demos" / f"incident-{name}.yaml"


@dataclass(frozen=True)
class IncidentRuns:
    before: RunOutputs
    after: RunOutputs


def incident_variants() -> list[str]:
    """The kernel variants the two replays run (replay.run.fleet_variants), from their configs."""
    from replay.run import fleet_variants

    sources = [str(demo_config_path(name)) for name in SCENARIOS]
    return fleet_variants((load_config(source), source) for source in sources)


def run_incident(out_dir: Path, *, force: bool = False, engine: str = "numba", progress=None) -> IncidentRuns:
    """Replay both fleets on the same mix and write `out_dir/before` and `out_dir/after`."""
    outs = {name: Path(out_dir) / name for name in SCENARIOS}
    inputs = [demo_config_path(name) for name in SCENARIOS]
    check_demo_out(Path(out_dir), force)
    for path in outs.values():
        check_out_dir(path, force, inputs)
    runs, timing = {}, {}
    with ExitStack() as held:  # both run directories locked until both are written
        for path in outs.values():
            held.enter_context(claimed(path, force, inputs))
        for name in SCENARIOS:
            began = time.perf_counter()
            source = str(demo_config_path(name))
            cfg: FleetConfig = load_config(source)
            plans = plan_pools(cfg, source)
            trace = load_from_config(cfg.trace, base_dir=Path(source).parent)
            timing[name] = {"load_trace_s": time.perf_counter() - began}
            runs[name] = replay_trace(trace, cfg, engine=engine, plans=plans, config_source=source,
                                      progress=progress)
        for name, run in runs.items():
            write_run(outs[name], run, force=force, timing=timing[name])
    return IncidentRuns(runs["before"], runs["after"])


def check_demo_out(out_dir: Path, force: bool) -> None:
    """The demo's --out is new or empty, or (with --force) a previous demo's: its before/ and
    after/ and nothing else (what dead writers of those left beside them aside). Anything else
    would end up with two runs' files side by side, or the demo's runs inside a user's folder."""
    if not existing_out_dir(out_dir):
        return
    entries = sorted(out_dir.iterdir())
    if not entries:
        return
    if not force:
        raise UserError(f"--out {out_dir}: already exists; choose another --out or pass --force to replace "
                        "a previous demo there")

    def ours(p: Path) -> bool:
        if p.name in SCENARIOS:
            return p.is_dir() and not p.is_symlink()
        m = LEFTOVER.match(p.name)
        return (m is not None and m["name"] in SCENARIOS) or p.name in {f".{n}.lock" for n in SCENARIOS}

    foreign = [p.name + ("/" if p.is_dir() else "") for p in entries if not ours(p)]
    if foreign:
        more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        raise UserError(f"--out {out_dir}: holds {', '.join(foreign[:5])}{more}; --force replaces only a previous "
                        f"demo's run directories ({', '.join(n + '/' for n in SCENARIOS)}); choose another --out")


def comparison(runs: IncidentRuns) -> pl.DataFrame:
    """The before/after table: latency and SLO per workload, then what it cost and what the
    dashboards showed (request rate, GPU-Util, queue depth, KV use)."""
    rows = []

    def add(label: str, before, after, unit: str) -> None:
        rows.append({"metric": label, "before": before, "after": after, "unit": unit})

    per = {name: _per_workload(getattr(runs, name).requests) for name in SCENARIOS}
    for workload in per["before"]["workload"].to_list():
        b = per["before"].filter(pl.col("workload") == workload).row(0, named=True)
        a = per["after"].filter(pl.col("workload") == workload).row(0, named=True)
        add(f"{workload} TTFT p50", b["ttft_p50_ms"], a["ttft_p50_ms"], "ms")
        add(f"{workload} TTFT p99", b["ttft_p99_ms"], a["ttft_p99_ms"], "ms")
        add(f"{workload} SLO attainment", b["slo"], a["slo"], "share")
    sb, sa = runs.before.summary, runs.after.summary
    add("SLO attainment (all)", sb["slo_attainment"], sa["slo_attainment"], "share")
    add("GPU-hours", sb["gpu_hours"], sa["gpu_hours"], "h")
    add("cost per M output tokens", sb["cost_per_mtok_out_usd"], sa["cost_per_mtok_out_usd"], "USD")
    tb = _fleet_ticks(runs.before.ticks)
    ta = _fleet_ticks(runs.after.ticks)
    add("request rate (mean)", tb["arrivals"], ta["arrivals"], "req/s")
    add("GPU-Util (mean)", tb["gpu_busy"], ta["gpu_busy"], "share")
    add("queue depth (peak waiting)", tb["waiting"], ta["waiting"], "requests")
    add("KV-cache use (peak)", tb["kv_usage"], ta["kv_usage"], "share")
    return pl.DataFrame(rows)


def _per_workload(requests: pl.DataFrame) -> pl.DataFrame:
    return (
        requests.group_by("workload")
        .agg(
            ttft_p50_ms=pl.col("ttft_us").quantile(0.5, "linear") / 1000,
            ttft_p99_ms=pl.col("ttft_us").quantile(0.99, "linear") / 1000,
            slo=pl.col("slo_met").mean(),
        )
        .sort("workload")
    )


def _fleet_ticks(ticks: pl.DataFrame) -> dict:
    """Fleet-wide view per tick (summed over pools), then over the replay: means and peaks."""
    fleet = ticks.group_by("t_us").agg(
        pl.col("arrivals").sum(),
        (pl.col("gpu_busy") * pl.col("replicas_active")).sum() / pl.col("replicas_active").sum().clip(1),
        pl.col("waiting").sum(),
        pl.col("kv_used_blocks").sum() / pl.col("kv_total_blocks").sum().clip(1),
    )
    return {
        "arrivals": fleet["arrivals"].mean(),
        "gpu_busy": fleet["gpu_busy"].mean(),
        "waiting": fleet["waiting"].max(),
        "kv_usage": fleet["kv_used_blocks"].max(),
    }
