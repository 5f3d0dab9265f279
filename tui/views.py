"""The incident-review views, computed from requests.parquet alone so they work across runs whose
pool layouts differ: one workload's metrics (fleet-wide, whichever pools served it) and one pool's
replicas side by side. Times are int64 microseconds; a window (lo, hi] is queried the way
RunData.fleet_ttft queries first tokens (lo == hi: the trailing window ending at a tick).

No per-replica series is written by the replay (ticks.parquet is per pool), so the replica view
derives queue, running and KV held from each request's routing and timestamps (see replica_state)."""

from __future__ import annotations

import numpy as np
import polars as pl

from tui.data import RunData
from tui.percentiles import window_percentiles

WORKLOAD_PREFIX = "workload:"  # a view scope "workload:chat" (pools and workloads may share names)


def workload_of(scope: str) -> str | None:
    return scope[len(WORKLOAD_PREFIX):] if scope.startswith(WORKLOAD_PREFIX) else None


def workloads(run: RunData) -> list[str]:
    """The workload labels of a run's requests, sorted (unlabelled requests are not a workload)."""
    key = ("workloads", run.table.height)
    if key not in run._memo:
        run._memo[key] = sorted(run.table["workload"].drop_nulls().unique().to_list())
    return run._memo[key]


# the columns of requests.parquet each view reads (when it is first shown)
WORKLOAD_COLUMNS = ("workload", "status", "arrival_us", "finished_us", "first_token_us", "ttft_us", "tpot_us", "slo_met")
REPLICA_COLUMNS = ("pool", "replica", "status", "arrival_us", "first_scheduled_us", "first_token_us", "finished_us",
                   "prompt_tokens", "output_tokens")


def _arrays(run: RunData, workload: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per signal: (times sorted, values) of one workload's requests."""
    key = ("workload-arrays", workload, run.table.height)
    if key in run._memo:
        return run._memo[key]
    req = run.table.select(*WORKLOAD_COLUMNS).filter(pl.col("workload") == workload)

    def by(frame: pl.DataFrame, t: str, v: pl.Expr) -> tuple[np.ndarray, np.ndarray]:
        frame = frame.select(t=pl.col(t), v=v.cast(pl.Float64)).drop_nulls().sort("t")
        return frame["t"].to_numpy(), frame["v"].to_numpy()

    done = req.filter(pl.col("status") == "finished")
    # ended: finished or rejected at arrival, as the window rule of replay.fleet.metrics counts them
    ended = req.filter(pl.col("status") != "unfinished").with_columns(
        ended_us=pl.coalesce("finished_us", "arrival_us"))
    out = {
        "arrivals": by(req, "arrival_us", pl.lit(1.0)),
        "finished": by(done, "finished_us", pl.lit(1.0)),
        "rejected": by(req.filter(pl.col("status") == "rejected"), "arrival_us", pl.lit(1.0)),
        "ttft": by(req, "first_token_us", pl.col("ttft_us") / 1000.0),
        "tpot": by(done, "finished_us", pl.col("tpot_us") / 1000.0),
        "met": by(ended, "ended_us", pl.col("slo_met").fill_null(False)),
    }
    run._memo[key] = out
    return out


# key -> (signal, how): a rate per second over the tick (or column), a percentile or a share over the window
WORKLOAD_KEYS = {
    "arrivals_per_s": ("arrivals", "rate"), "finished_per_s": ("finished", "rate"),
    "rejected_per_s": ("rejected", "rate"),
    "ttft_p50_ms": ("ttft", 50), "ttft_p99_ms": ("ttft", 99),
    "tpot_p50_ms": ("tpot", 50), "tpot_p99_ms": ("tpot", 99),
    "slo_attainment": ("met", "mean"),
}


def workload_values(run: RunData, workload: str, key: str, lo_us: np.ndarray, hi_us: np.ndarray) -> np.ndarray:
    """One workload's metric per (lo, hi]: rates count over (lo - tick, hi], percentiles and the
    SLO share over (lo - window, hi] (the tick columns' trailing window when lo == hi). NaN
    where the window holds nothing (a percentile) or nothing ended (the share)."""
    signal, how = WORKLOAD_KEYS[key]
    times, values = _arrays(run, workload)[signal]
    lo_us, hi_us = np.asarray(lo_us, np.int64), np.asarray(hi_us, np.int64)
    reach = run.tick_us if how == "rate" else run.window_us
    a = np.searchsorted(times, lo_us - reach, side="right")
    b = np.searchsorted(times, hi_us, side="right")
    if how == "rate":
        return (b - a) / ((hi_us - lo_us + run.tick_us) / 1e6)
    out = np.full(len(a), np.nan)
    if how == "mean":
        cum = np.concatenate(([0.0], np.cumsum(values)))
        n = b - a
        np.divide(cum[b] - cum[a], n, out=out, where=n > 0)
        return out
    return window_percentiles(values, a, b, [how], lambda: run.order_of(f"{workload}:{signal}", values))[:, 0]


# -- replicas ---------------------------------------------------------------------------------
def replicas_of(run: RunData, pool: str) -> list[int]:
    key = ("replicas", pool, run.table.height)
    if key not in run._memo:
        ids = run.table.select("pool", "replica").filter(pl.col("pool") == pool)["replica"].drop_nulls().unique().sort()
        run._memo[key] = [int(r) for r in ids.to_list()]
    return run._memo[key]


def _replica_arrays(run: RunData, pool: str) -> dict[int, dict[str, np.ndarray]]:
    """Per replica, sorted edge times: a request waits from arrival to its first schedule and runs
    from then to its end (still running at the run's end if unfinished)."""
    key = ("replica-arrays", pool, run.table.height)
    if key in run._memo:
        return run._memo[key]
    never = np.iinfo(np.int64).max
    req = run.table.select(*REPLICA_COLUMNS).filter((pl.col("pool") == pool) & pl.col("replica").is_not_null()
                              & (pl.col("status") != "rejected"))
    out = {}
    for (replica,), part in req.group_by(["replica"], maintain_order=True):
        sched = part["first_scheduled_us"].fill_null(never).to_numpy()
        end = part["finished_us"].fill_null(never).to_numpy()
        first = part["first_token_us"].fill_null(never).to_numpy()
        order = np.argsort(sched, kind="stable")
        out[int(replica)] = {
            "arrive": np.sort(part["arrival_us"].to_numpy()), "sched": np.sort(sched), "end": np.sort(end),
            # for KV held: each running request's prompt plus the tokens decoded so far
            "s_sched": sched[order], "s_end": end[order], "s_first": first[order],
            "s_prompt": part["prompt_tokens"].to_numpy()[order].astype(np.float64),
            "s_output": part["output_tokens"].to_numpy()[order].astype(np.float64),
        }
    run._memo[key] = out
    return out


def replica_state(run: RunData, pool: str, t_us: int) -> dict[int, tuple[int, int, float]]:
    """Per replica at t: (queued, running, KV tokens held). Queued: routed, not yet scheduled;
    running: scheduled, not finished. KV held is an estimate: the running requests' prompts plus
    their output decoded at an even pace from first token to finish (preemptions, which free and
    recompute blocks, and prefix-cache sharing are not in requests.parquet)."""
    out = {}
    for replica, a in _replica_arrays(run, pool).items():
        arrived = np.searchsorted(a["arrive"], t_us, side="right")
        sched = np.searchsorted(a["sched"], t_us, side="right")
        ended = np.searchsorted(a["end"], t_us, side="right")
        k = np.searchsorted(a["s_sched"], t_us, side="right")
        live = a["s_end"][:k] > t_us
        first, end = a["s_first"][:k][live], a["s_end"][:k][live]
        span = np.maximum(end - first, 1).astype(np.float64)
        done = np.clip((t_us - first) / span, 0.0, 1.0)
        held = a["s_prompt"][:k][live].sum() + (a["s_output"][:k][live] * done).sum()
        out[replica] = (int(arrived - sched), int(sched - ended), float(held))
    return out


def replica_queue_columns(run: RunData, pool: str, edges: np.ndarray) -> dict[int, np.ndarray]:
    """Per replica, the queue at each chart column's right edge (the column's last tick)."""
    out = {}
    for replica, a in _replica_arrays(run, pool).items():
        at = edges[1:]
        out[replica] = (np.searchsorted(a["arrive"], at, side="right")
                        - np.searchsorted(a["sched"], at, side="right")).astype(np.float64)
    return out


def kv_capacity_tokens(run: RunData, pool: str, t_us: int) -> float | None:
    """One replica's KV cache in tokens at t: the pool's blocks over its serving replicas, times
    the block size of its engine (None when the pool had no serving replica)."""
    series = run.series.get(pool)
    i = run.index_at(t_us)
    if series is None or i is None:
        return None
    serving = series["replicas_active"][i] + series["replicas_draining"][i]
    if serving <= 0:
        return None
    return float(series["kv_total_blocks"][i] / serving * run.block_size.get(pool, 16))


# -- the replica view's panel -------------------------------------------------------------------
def replica_pool(model) -> str | None:
    """The pool the replica view shows: the scope when it is a pool, else the first run's first."""
    scope = model.view.scope
    if any(scope in r.pools for r in model.runs):
        return scope
    return model.runs[0].pools[0] if model.runs[0].pools else None


def _bar(value: float, top: float, width: int) -> str:
    filled = 0 if top <= 0 else round(min(value / top, 1.0) * width)
    return "█" * filled + "░" * (width - filled)


def replica_lines(model, width: int, height: int) -> list:
    """Per run having the pool: at the cursor, each replica's queue, running and KV held side by
    side (bars share one scale across replicas and runs, so a router's imbalance shows as unequal
    bars), then each replica's queue over the whole run."""
    from rich.text import Text

    from tui.charts import bar_cells, cells_text, chart_top, column_edges, column_of
    from tui.panels import RUN_STYLES
    from tui.timefmt import fmt_time

    pool = replica_pool(model)
    t = model.view.cursor_us
    lines = [Text.assemble((f" replicas of pool {pool or '-'} ", "bold reverse"), f"  at {fmt_time(t)}   ",
                           ("p", "bold"), " pool  ", ("←→", "bold"), " seek  ", ("esc r", "bold"), " back")]
    runs = [(k, r) for k, r in enumerate(model.runs) if pool in r.pools]
    for k, run in enumerate(model.runs):
        if pool not in run.pools:
            lines.append(Text(f" {run.name} has no pool {pool!r}", RUN_STYLES[k] + " italic"))
    states = {k: replica_state(run, pool, t) for k, run in runs}
    top_q = max([1, *(q for s in states.values() for q, _, _ in s.values())])
    top_r = max([1, *(r for s in states.values() for _, r, _ in s.values())])
    bar_w = max((width - 50) // 3, 4)
    chart_w = max(width - 12, 4)
    edges = column_edges(0, model.t_end, chart_w)
    queues = {k: replica_queue_columns(run, pool, edges) for k, run in runs}
    q_top = chart_top(*(c for q in queues.values() for c in q.values())) if queues else 1.0
    for k, run in runs:
        cap = kv_capacity_tokens(run, pool, t)
        lines.append(Text(f" {run.name}" + ("" if states[k] else ": no request routed to a replica yet"),
                          RUN_STYLES[k] + " bold"))
        for replica, (queued, running, held) in states[k].items():
            kv = f"{held / cap:>4.0%}" if cap else f"{held / 1000:>4.0f}k"
            lines.append(Text.assemble(
                (f"  r{replica:<3}", RUN_STYLES[k]), " queue ", (_bar(queued, top_q, bar_w), "yellow"), f" {queued:>5}",
                "  running ", (_bar(running, top_r, bar_w), "green"), f" {running:>4}",
                "  KV ", (_bar(held / cap if cap else 0.0, 1.0, bar_w), "cyan"), f" {kv}"))
    lines.append(Text(" queue per replica over the run", "bold"))
    cursor = column_of(t, 0, model.t_end, chart_w)
    for k, run in runs:
        for replica, col in queues[k].items():
            chars, styles = bar_cells(col, q_top, 1, style=RUN_STYLES[k])[0]
            row = Text(f"  {'AB'[k] if model.compare else ' '} r{replica:<5}", RUN_STYLES[k])
            row.append_text(cells_text(chars, styles, cursor))
            lines.append(row)
    lines.append(Text(" KV: running requests' prompt + output decoded so far (estimated from requests.parquet) "
                      "over one replica's blocks", "grey50 italic"))
    lines = lines[:height]
    for line in lines:
        line.truncate(width)
    return lines
