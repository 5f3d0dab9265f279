"""The incident-review views, computed from requests.parquet alone so they work across runs whose
pool layouts differ: one workload's metrics (fleet-wide, whichever pools served it) and one pool's
replicas side by side. Times are int64 microseconds; a window (lo, hi] is queried the way
RunData.fleet_ttft queries first tokens (lo == hi: the trailing window ending at a tick).

Each reads only what the screen shows (RequestTable.query), never a column whole: a workload's
label list is one streaming `unique`; its figures are kept as arrays of that workload's rows up
to tui.data.KEEP_FIRSTS requests, past it read a span of time at a time (tui.percentiles.by_pass:
the cursor's window is one query, a chart's columns a pass over the run), every figure of the
view from the same reads. The same figures either way: the windows' values are the same ones.

No per-replica series is written by the replay (ticks.parquet is per pool), so the replica view
derives queue, running and KV held from each request's routing and timestamps (see replica_state):
at the cursor from the rows whose timestamps straddle it, over the run as counts per chart column
in one streaming pass that holds no column."""

from __future__ import annotations

import numpy as np
import polars as pl

import tui.data as tui_data
from tui.data import RunData
from tui.percentiles import by_pass, window_percentiles
from tui.validate import CHECK_BATCH

WORKLOAD_PREFIX = "workload:"  # a view scope "workload:chat" (pools and workloads may share names)


def workload_of(scope: str) -> str | None:
    return scope[len(WORKLOAD_PREFIX):] if scope.startswith(WORKLOAD_PREFIX) else None


def workloads(run: RunData) -> list[str]:
    """The workload labels of a run's requests, sorted (unlabelled requests are not a workload)."""
    key = ("workloads", run.table.height)
    if key not in run._memo:
        got = run.table.query(lambda req: req.select(pl.col("workload").drop_nulls().unique()))
        run._memo[key] = sorted(got["workload"].to_list())
    return run._memo[key]


# the columns of requests.parquet each view reads
WORKLOAD_COLUMNS = ("workload", "status", "arrival_us", "finished_us", "first_token_us", "ttft_us", "tpot_us", "slo_met")
REPLICA_COLUMNS = ("pool", "replica", "status", "arrival_us", "first_scheduled_us", "first_token_us", "finished_us",
                   "prompt_tokens", "output_tokens")


RANKED = ("ttft", "tpot")  # the signals of percentiles; the others are counted in their windows


def _signals(req: pl.DataFrame, wanted=None, sort_counts: bool = True) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per signal (`wanted`, or all): (times, values) of these requests (of one workload), by
    time (those only counted left in file order unless `sort_counts`: _figure counts them so)."""
    def by(name: str, frame: pl.DataFrame, t: str, v: pl.Expr) -> tuple[np.ndarray, np.ndarray]:
        frame = frame.select(t=pl.col(t), v=v.cast(pl.Float64)).drop_nulls()
        if sort_counts or name in RANKED:
            frame = frame.sort("t")
        return frame["t"].to_numpy(), frame["v"].to_numpy()

    done = lambda: req.filter(pl.col("status") == "finished")  # noqa: E731
    # ended: finished or rejected at arrival, as the window rule of replay.fleet.metrics counts them
    ended = lambda: req.filter(pl.col("status") != "unfinished").with_columns(  # noqa: E731
        ended_us=pl.coalesce("finished_us", "arrival_us"))
    signals = {
        "arrivals": lambda: (req, "arrival_us", pl.lit(1.0)),
        "finished": lambda: (done(), "finished_us", pl.lit(1.0)),
        "rejected": lambda: (req.filter(pl.col("status") == "rejected"), "arrival_us", pl.lit(1.0)),
        "ttft": lambda: (req, "first_token_us", pl.col("ttft_us") / 1000.0),
        "tpot": lambda: (done(), "finished_us", pl.col("tpot_us") / 1000.0),
        "met": lambda: (ended(), "ended_us", pl.col("slo_met").fill_null(False)),
    }
    return {name: by(name, *signals[name]()) for name in (wanted or signals)}


def _arrays(run: RunData, workload: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """_signals of every request of one workload (a run of up to KEEP_FIRSTS requests)."""
    key = ("workload-arrays", workload, run.table.height)
    if key not in run._memo:
        rows = run.table.query(lambda req: req.filter(pl.col("workload") == workload).select(WORKLOAD_COLUMNS))
        run._memo[key] = _signals(rows)
    return run._memo[key]


# key -> (signal, how): a rate per second over the tick (or column), a percentile or a share over the window
WORKLOAD_KEYS = {
    "arrivals_per_s": ("arrivals", "rate"), "finished_per_s": ("finished", "rate"),
    "rejected_per_s": ("rejected", "rate"),
    "ttft_p50_ms": ("ttft", 50), "ttft_p99_ms": ("ttft", 99),
    "tpot_p50_ms": ("tpot", 50), "tpot_p99_ms": ("tpot", 99),
    "slo_attainment": ("met", "mean"),
}


def workload_values(run: RunData, workload: str, key: str, lo_us: np.ndarray, hi_us: np.ndarray,
                    together: tuple[str, ...] = tuple(WORKLOAD_KEYS)) -> np.ndarray:
    """One workload's metric per (lo, hi]: rates count over (lo - tick, hi], percentiles and the
    SLO share over (lo - window, hi] (the tick columns' trailing window when lo == hi). NaN
    where the window holds nothing (a percentile) or nothing ended (the share). A run past
    KEEP_FIRSTS requests reads the windows' rows once for every key `together` (the view's rows
    at the cursor, or a chart's columns) and keeps those figures."""
    lo_us, hi_us = np.asarray(lo_us, np.int64), np.asarray(hi_us, np.int64)
    if run.table.height <= tui_data.KEEP_FIRSTS:
        signal = WORKLOAD_KEYS[key][0]
        signals = _arrays(run, workload)
        values, name = signals[signal][1], f"{workload}:{signal}"
        return _figure(run, signals, key, lo_us, hi_us, lambda: run.order_of(name, values),
                       lambda: run.cumsum_of(name, values))  # (kept: a cursor move is then two searches)
    keys = together if key in together else (key,)
    memo = ("workload-values", workload, keys, lo_us.tobytes(), hi_us.tobytes(), run.table.height)
    if memo not in run._memo:
        run._memo[memo] = _read_values(run, workload, keys, lo_us, hi_us)
    return run._memo[memo][:, keys.index(key)]


def _read_values(run: RunData, workload: str, keys: tuple[str, ...], lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """workload_values of `keys` (a column each) read a span at a time: each pass the rows of the
    workload with a time of some signal in its span (so every signal's values in its windows)."""
    wanted = sorted({WORKLOAD_KEYS[k][0] for k in keys})
    values = {"ttft": "ttft_us", "tpot": "tpot_us", "met": "slo_met"}  # (the others: times and status)
    columns = [c for c in WORKLOAD_COLUMNS if c not in values.values() or any(values.get(w) == c for w in wanted)]

    def read(t0: int, t1: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        span = lambda c: (pl.col(c) > t0) & (pl.col(c) <= t1)  # noqa: E731 - (row groups skipped by their statistics)
        rows = run.table.query(lambda req: req.filter(
            (pl.col("workload") == workload) & (span("arrival_us") | span("first_token_us") | span("finished_us")))
            .select(columns))
        return _signals(rows, wanted, sort_counts=False)

    def of(signals: dict, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        return np.column_stack([_figure(run, signals, k, lo, hi, lambda k=k: np.argsort(signals[WORKLOAD_KEYS[k][0]][1]))
                                for k in keys])

    return by_pass(read, of, lo, hi, max(run.tick_us, run.window_us), run.pass_span_us, len(keys))


def _figure(run: RunData, signals: dict, key: str, lo_us: np.ndarray, hi_us: np.ndarray, order,
            cumsum=None) -> np.ndarray:
    """One key's figure per window from a signal's (times, values) holding every value of those windows;
    `order()` their values' argsort, `cumsum()` (or None) the running sums of values sorted by time."""
    signal, how = WORKLOAD_KEYS[key]
    times, values = signals[signal]
    reach = run.tick_us if how == "rate" else run.window_us
    if how not in ("rate", "mean"):
        a = np.searchsorted(times, lo_us - reach, side="right")
        b = np.searchsorted(times, hi_us, side="right")
        return window_percentiles(values, a, b, [how], order)[:, 0]
    (a, met_a), (b, met_b) = _at_most(times, values, lo_us - reach, hi_us, cum=cumsum() if cumsum else None)
    if how == "rate":
        return (b - a) / ((hi_us - lo_us + run.tick_us) / 1e6)
    out = np.full(len(a), np.nan)
    n = b - a
    np.divide(met_b - met_a, n, out=out, where=n > 0)
    return out


def _at_most(times: np.ndarray, values: np.ndarray, *points: np.ndarray,
             cum: np.ndarray | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per array of points: (how many times are at most each, the sum of their values). Values of
    0 and 1 (counts, SLO met) sum exactly in any order, so unsorted times (a pass's, in file
    order) are counted into the points' bins rather than sorted. `cum`: times are sorted and
    these are their values' running sums from 0 (RunData.cumsum_of)."""
    if cum is None and (len(times) < 2 or (times[1:] >= times[:-1]).all()):
        cum = np.concatenate(([0.0], np.cumsum(values)))
    if cum is not None:
        return [(at, cum[at]) for at in (np.searchsorted(times, p, side="right") for p in points)]
    edges = np.unique(np.concatenate(points))
    slot = np.searchsorted(edges, times, side="left")  # bin k: edges[k - 1] < t <= edges[k]
    n = np.cumsum(np.bincount(slot, minlength=len(edges) + 1))
    total = np.cumsum(np.bincount(slot, weights=values, minlength=len(edges) + 1))
    return [(n[k], total[k]) for k in (np.searchsorted(edges, p) for p in points)]


# -- replicas ---------------------------------------------------------------------------------
def _routed(pool: str) -> pl.Expr:
    """The requests the replica view counts: routed to one of the pool's replicas, not rejected."""
    return (pl.col("pool") == pool) & pl.col("replica").is_not_null() & (pl.col("status") != "rejected")


def replicas_of(run: RunData, pool: str) -> list[int]:
    key = ("replicas", pool, run.table.height)
    if key not in run._memo:
        ids = run.table.query(lambda req: req.filter(pl.col("pool") == pool).select(
            pl.col("replica").drop_nulls().unique()))["replica"].sort()
        run._memo[key] = [int(r) for r in ids.to_list()]
    return run._memo[key]


def _replica_order(run: RunData, pool: str) -> list[int]:
    """The replicas the view shows (any request routed to one, not rejected), as they first appear
    in requests.parquet."""
    key = ("replica-order", pool, run.table.height)
    if key not in run._memo:
        got = run.table.query(lambda req: req.with_row_index("row").filter(_routed(pool))
                              .group_by("replica").agg(pl.col("row").min()).sort("row"))
        run._memo[key] = [int(r) for r in got["replica"].to_list()]
    return run._memo[key]


NEVER = np.iinfo(np.int64).max


def replica_state(run: RunData, pool: str, t_us: int) -> dict[int, tuple[int, int, float]]:
    """Per replica at t: (queued, running, KV tokens held). Queued: routed, not yet scheduled
    (arrived by t, less scheduled by t); running: scheduled, not finished. KV held is an estimate:
    the running requests' prompts plus their output decoded at an even pace from first token to
    finish (preemptions, which free and recompute blocks, and prefix-cache sharing are not in
    requests.parquet). Read from the rows that count at t alone: some of their times by t, some after."""
    key = ("replica-state", pool, t_us, run.table.height)
    if key in run._memo:
        return run._memo[key]
    by = lambda c: pl.col(c).is_not_null() & (pl.col(c) <= t_us)  # noqa: E731
    after = lambda c: pl.col(c).is_null() | (pl.col(c) > t_us)  # noqa: E731 - (null: never)
    times = ("arrival_us", "first_scheduled_us", "finished_us")
    rows = run.table.query(lambda req: req.filter(
        _routed(pool) & pl.any_horizontal(*(by(c) for c in times)) & pl.any_horizontal(*(after(c) for c in times)))
        .select(REPLICA_COLUMNS[1:]))
    parts = {int(r): part for (r,), part in rows.group_by(["replica"], maintain_order=True)}
    out = {}
    for replica in _replica_order(run, pool):
        part = parts.get(replica)
        out[replica] = (0, 0, 0.0) if part is None else _state_of(part, t_us)
    run._memo[key] = out
    return out


def _state_of(part: pl.DataFrame, t_us: int) -> tuple[int, int, float]:
    """(queued, running, KV held) at t of one replica's rows (in file order) that count at t."""
    arrive = part["arrival_us"].to_numpy()
    sched = part["first_scheduled_us"].fill_null(NEVER).to_numpy()
    end = part["finished_us"].fill_null(NEVER).to_numpy()
    first = part["first_token_us"].fill_null(NEVER).to_numpy()
    order = np.argsort(sched, kind="stable")  # held: summed in the order of their scheduling
    sched, end, first = sched[order], end[order], first[order]
    live = (sched <= t_us) & (end > t_us)
    first, last = first[live], end[live]
    span = np.maximum(last - first, 1).astype(np.float64)
    done = np.clip((t_us - first) / span, 0.0, 1.0)
    prompt = part["prompt_tokens"].to_numpy()[order].astype(np.float64)[live]
    output = part["output_tokens"].to_numpy()[order].astype(np.float64)[live]
    held = prompt.sum() + (output * done).sum()
    queued = int((arrive <= t_us).sum()) - int((sched <= t_us).sum())
    running = int((sched <= t_us).sum()) - int((end <= t_us).sum())
    return queued, running, float(held)


def replica_queue_columns(run: RunData, pool: str, edges: np.ndarray) -> dict[int, np.ndarray]:
    """Per replica, the queue at each chart column's right edge (the column's last tick): arrived
    by then less scheduled by then, counted in one pass a batch at a time."""
    key = ("replica-queues", pool, edges.tobytes(), run.table.height)
    if key in run._memo:
        return run._memo[key]
    replicas = _replica_order(run, pool)
    at = np.asarray(edges[1:], np.int64)
    by_id, slot_of = np.unique(np.array(replicas, np.int64), return_index=True)  # replica id -> its row

    def count(queue: np.ndarray, batch: pl.DataFrame) -> np.ndarray:
        row = slot_of[np.searchsorted(by_id, batch["replica"].to_numpy())] * (len(at) + 1)
        for column, sign in (("arrival_us", 1), ("first_scheduled_us", -1)):
            t = batch[column].fill_null(NEVER).to_numpy()  # bin i: at[i - 1] < t <= at[i]
            queue += sign * np.bincount(row + np.searchsorted(at, t, side="left"), minlength=queue.size
                                        ).reshape(queue.shape)
        return queue

    queue = run.table.fold(lambda req: req.filter(_routed(pool)).select("replica", "arrival_us", "first_scheduled_us"),
                           lambda: np.zeros((len(replicas), len(at) + 1), np.int64), count, CHECK_BATCH)
    out = {r: np.cumsum(queue[k])[:-1].astype(np.float64) for k, r in enumerate(replicas)}
    run._memo[key] = out
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
