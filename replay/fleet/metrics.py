"""Run outputs as polars frames: one row per request, one row per pool per tick, a summary.

Definitions (DESIGN.md, "Metrics"): TTFT = first token - arrival (queueing included);
TPOT = (finish - first token) / (output_tokens - 1); E2E = finish - arrival. SLO attainment =
share of requests that finished within both the TTFT and TPOT targets, over every request (a
rejected or unfinished request is a miss: DESIGN.md's "of finished requests" flattered a fleet
that sheds load); goodput = SLO-meeting requests per second of the replay.
Cost accrues per GPU from provisioning; cost per million tokens says which tokens it counts.
Percentiles interpolate linearly between ranks (numpy's and polars' default).
"""

from __future__ import annotations

import copy

import replay._numba_cache  # noqa: F401  (before any kernel is defined)

import numpy as np
import polars as pl
from numba import njit

from replay.fleet.cluster import RawRun
from replay.config import FleetConfig
from replay.engine.common import EVENT_NAMES, REJECT_NAMES
from replay.fleet.request_rows import REQUEST_COLUMNS, STATUS_NAMES, RowMaker  # noqa: F401 - REQUEST_COLUMNS re-exported
from replay.fleet.saturation import classify_pool
from replay.fleet.selection import exact_quantiles
from replay.outputs.schema import EVENTS, TICKS

# The column orders of README "Run outputs", declared in replay/outputs/schema.py with their dtypes.
TICK_COLUMNS = TICKS.names


def request_frame(trace: pl.DataFrame, raw: RawRun, cfg: FleetConfig) -> pl.DataFrame:
    """Every request's row as one frame (a live run's chunks; a replay's go through `RowMaker`
    a chunk at a time)."""
    return RowMaker(trace, raw.plans, raw.pool_index, raw.replica_slots, cfg).frame(0, raw.requests)


def _window_percentiles(times, values, t_us, window_us, qs):
    """Percentiles (linear, as numpy) of `values` whose `times` lie in (t - window, t], per t.
    `times` is sorted; NaN where the window is empty.

    Not a sort of every window (O(ticks x window x log), minutes for a day of 17M requests): each
    value is ranked once (numpy's argsort; NaN last, as np.sort puts them), and the window's
    counts over the ranks follow it as it slides, each value counted in once and out once. The
    k-th smallest is then a walk down the counts, and the interpolation is the slow kernel's,
    operation for operation (tests/unit/test_window_percentiles.py keeps it), so the floats are
    the same. How ties are ranked does not matter: equal values give the same float (+0.0 and
    -0.0 too: the interpolation gives the same float whichever sign its zeros have).
    """
    return _window_percentiles_ranked(times, values, np.argsort(values), t_us, window_us, qs)


@njit(cache=True, no_cfunc_wrapper=True)
def _window_percentiles_ranked(times, values, order, t_us, window_us, qs):
    """_window_percentiles, given `order`: the positions of `values` from smallest to largest."""
    lo = np.searchsorted(times, t_us - window_us, side="right")
    hi = np.searchsorted(times, t_us, side="right")
    return percentiles_in_spans(values, order, lo, hi, qs, False)


@njit(cache=True, no_cfunc_wrapper=True)
def percentiles_in_spans(values, order, lo, hi, qs, as_numpy):
    """Percentiles (linear) of `values[lo[i]:hi[i]]` per i (empty when lo >= hi: NaN; positions
    clamped to [0, len(values)]), `order` the positions of `values` from smallest to largest.
    Spans that move forward (both ends non-decreasing: trailing windows, chart columns) count each
    value in once and out once.
    `as_numpy`: interpolate as np.percentile does (from the upper value when the fraction is
    >= 0.5, numpy's _lerp), for the same floats as it; else as the tick columns always have."""
    out = np.full((len(lo), len(qs)), np.nan)
    size = len(values)
    rank = np.empty(size, np.int32)
    for r in range(size):
        rank[order[r]] = r
    # A count tree of fan-out 64: whether each rank is in the window, and the window's counts per
    # 64, 4,096 and 262,144 ranks. A count is one increment per level (a Fenwick tree's ~log2 n
    # scattered ones missed the cache: 3x slower at 17M values); the k-th smallest walks down the
    # levels, at most 64 steps in each but the top (n / 262,144 entries: 65 at 17M).
    counts = (np.zeros(size + 1, np.int8), np.zeros((size >> 6) + 1, np.int32),
              np.zeros((size >> 12) + 1, np.int32), np.zeros((size >> 18) + 1, np.int32))
    a = b = 0  # the counts hold the values at positions [a, b)
    # typed, not literal: a literal 1 and -1 would compile _count once for each
    add, remove = np.int64(1), np.int64(-1)
    for i in range(len(lo)):
        # Positions outside [0, size] are clamped to it: numba does not check bounds, and a
        # negative one would wrap (past -size, to memory outside the arrays).
        end = min(max(hi[i], 0), size)
        first = min(max(lo[i], 0), end)
        # To the union of the two windows first, so that a <= b throughout; then down to the new
        # one. Ticks in time order move each value in once and out once.
        while b < end:
            _count(counts, rank[b], add)
            b += 1
        while a > first:
            a -= 1
            _count(counts, rank[a], add)
        while a < first:
            _count(counts, rank[a], remove)
            a += 1
        while b > end:
            b -= 1
            _count(counts, rank[b], remove)
        n = end - first
        if n == 0:
            continue
        for k in range(len(qs)):
            pos = qs[k] * (n - 1)
            j = int(np.floor(pos))
            frac = pos - j
            below = values[order[_kth(counts, j + 1)]]
            upper = values[order[_kth(counts, min(j + 2, n))]]
            if as_numpy and frac >= 0.5:
                out[i, k] = upper - (upper - below) * (1 - frac)
            else:
                out[i, k] = below + (upper - below) * frac
    return out


@njit(cache=True, no_cfunc_wrapper=True)
def _count(counts, rank, delta):
    one, per64, per4096, per262144 = counts
    one[rank] += delta
    per64[rank >> 6] += delta
    per4096[rank >> 12] += delta
    per262144[rank >> 18] += delta


@njit(cache=True, no_cfunc_wrapper=True)
def _kth(counts, k):
    """The rank of the k-th smallest (k >= 1) of the counted values."""
    one, per64, per4096, per262144 = counts
    at = 0
    while per262144[at] < k:
        k -= per262144[at]
        at += 1
    at <<= 6
    while per4096[at] < k:
        k -= per4096[at]
        at += 1
    at <<= 6
    while per64[at] < k:
        k -= per64[at]
        at += 1
    at <<= 6
    while one[at] < k:
        k -= one[at]
        at += 1
    return at


def read(lf: pl.LazyFrame) -> pl.DataFrame:
    """A few columns of the request rows, read by polars' streaming engine: a chunk of the rows
    at a time, so that filtering a day's rows holds only what passes (in their order)."""
    return lf.collect(engine="streaming")


# First tokens read at a time for a pool's TTFT windows (`_window_stats`): a span of ticks whose
# windows hold at most this many together (a tick whose window alone holds more is read whole).
# ~50 bytes a first token at the peak (the read, its sort, the TTFTs as floats, their ranks): ~400 MB.
SPAN_ROWS = 1 << 23
QUANTILES = np.array([0.5, 0.99])


def _window_stats(t_us: np.ndarray, requests: pl.LazyFrame, window_us: int,
                  span_rows: int = SPAN_ROWS) -> dict[str, np.ndarray]:
    """TTFT p50/p99 over first tokens in (t - window, t]; SLO attainment over requests that ended
    in it (finished, or rejected at arrival: a rejection is a miss). `t_us` in time order.

    In memory bounded by the ticks and `span_rows`, not by the rows (a day of 115M requests held
    16 bytes of each twice, sorted): every window's ends are `edges`, and one streaming pass
    counts the rows at or before each edge (`_counts_at`), so a window's count is a difference of
    two, exactly as searchsorted (side="right") in the sorted column gave it. The percentiles,
    not additive, are read a span of ticks at a time: the first tokens of its windows (the span
    and its lead-in of one window), the same values per window, so the same floats."""
    t = t_us.astype(np.int64)
    window = np.int64(window_us)
    edges = np.unique(np.concatenate((t - window, t)))
    start, end = np.searchsorted(edges, t - window), np.searchsorted(edges, t)
    firsts, ended, met = _counts_at(requests, edges)
    count = ended[end] - ended[start]
    attained = np.full(len(t), np.nan)
    np.divide(met[end] - met[start], count, out=attained, where=count > 0)
    pcts = np.full((len(t), len(QUANTILES)), np.nan)
    lo, hi = firsts[start], firsts[end]  # first tokens at or before each window's start, its end
    a = 0
    while a < len(t):
        # the longest span from tick a whose windows hold at most span_rows (one tick at least)
        b = max(a + 1, int(np.searchsorted(hi, lo[a] + max(1, span_rows), side="right")))
        if hi[b - 1] > lo[a]:  # not all empty
            pcts[a:b] = _span_percentiles(requests, t[a:b], window)
        a = b
    return {"ttft_p50_ms": pcts[:, 0], "ttft_p99_ms": pcts[:, 1], "slo_attainment": attained}


def _counts_at(requests: pl.LazyFrame, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """How many first tokens, ended requests and ended requests that met the SLO are at or before
    each of `edges` (sorted): per-edge counts of one streaming pass of the rows (a row counts at
    the first edge at or after it), summed.

    The ticks' edges lie on a grid (t and t - window, both whole ticks): a row's grid point is
    then arithmetic, not a binary search among the edges (polars' search_sorted was ~40% of
    each pass over a day's 24M rows); other edges are searched."""
    grid = _grid(edges)

    def at_edge(us: pl.Expr) -> pl.Expr:
        if grid is None:
            return pl.lit(pl.Series(edges)).search_sorted(us, side="left").alias("edge")
        start, step, size = grid  # the first grid point at or after `us`, of size (and one past them all)
        return ((us - start + (step - 1)) // step).clip(0, size).alias("edge")

    firsts = requests.filter(pl.col("first_token_us").is_not_null()).group_by(
        at_edge(pl.col("first_token_us"))).agg(n=pl.len())
    done = requests.filter(pl.col("status") != "unfinished").group_by(
        at_edge(pl.coalesce("finished_us", "arrival_us"))).agg(n=pl.len(), met=pl.col("slo_met").sum())
    firsts, done = pl.collect_all([firsts, done], engine="streaming")
    points = len(edges) if grid is None else grid[2]
    at = np.arange(len(edges)) if grid is None else (edges - grid[0]) // grid[1]  # each edge's point

    def at_or_before(frame: pl.DataFrame, column: str) -> np.ndarray:
        per_point = np.zeros(points + 1, np.int64)  # the last: after every edge
        per_point[frame["edge"].to_numpy()] = frame[column].to_numpy()
        return np.cumsum(per_point[:-1])[at]

    return at_or_before(firsts, "n"), at_or_before(done, "n"), at_or_before(done, "met")


def _grid(edges: np.ndarray) -> tuple[int, int, int] | None:
    """(first, step, points) of the evenly spaced points that hold every edge, when there are
    not many more of them than edges; else None."""
    if len(edges) == 0:
        return None
    step = int(np.gcd.reduce(np.diff(edges))) if len(edges) > 1 else 1
    points = int(edges[-1] - edges[0]) // step + 1
    return (int(edges[0]), step, points) if points <= 4 * len(edges) + 64 else None


def _span_percentiles(requests: pl.LazyFrame, t: np.ndarray, window: np.int64) -> np.ndarray:
    """TTFT p50/p99 (ms) at ticks `t`, from the first tokens of their windows only (polars skips
    the row groups of the parts whose statistics say they hold none)."""
    firsts = read(requests.select("first_token_us", "ttft_us").filter(
        pl.col("first_token_us").is_between(t.min() - window, t.max(), closed="right")))
    first = firsts["first_token_us"].to_numpy()
    # First tokens come nearly in order (the rows' arrival order, each plus its TTFT): numpy's
    # stable sort (a timsort) orders a day's in a third of polars' sort's CPU time. How equal
    # first tokens are ordered does not matter: a window holds all of them or none.
    by_time = np.argsort(first, kind="stable")
    first = first[by_time]
    first.flags.writeable = False  # as polars hands a column over: the kernel's one signature (engine/prebuild.py)
    ttft_ms = firsts["ttft_us"].to_numpy().astype(np.float64)[by_time]
    del firsts, by_time
    ttft_ms /= 1000.0  # in place (numpy's division: polars' may round differently)
    return _window_percentiles(first, ttft_ms, t, window, QUANTILES)


def tick_frame(raw: RawRun, requests: pl.DataFrame | pl.LazyFrame, cfg: FleetConfig) -> pl.DataFrame:
    tk = raw.ticks
    tick_s = raw.tick_us / 1e6
    window_ticks = max(1, round(cfg.metrics_window_s * 1e6 / raw.tick_us))
    frames = []
    # Only the columns the windows read: a pool's requests are filtered and sorted from these, not
    # from copies of the whole request frame (three of them per pool at 1M requests: ~400 MB).
    slim = requests.lazy().select("pool", "prefill_pool", "first_token_us", "ttft_us", "status", "finished_us",
                           "arrival_us", "slo_met")
    for plan in raw.plans:
        p = plan.index

        def col(name: str) -> np.ndarray:
            return tk[name][:, p]

        def per_tick(name: str) -> np.ndarray:
            return np.diff(col(name), prepend=0)

        gpus = col("gpus")
        cost_tick = gpus * plan.price_usd_per_gpu_hour * tick_s / 3600.0
        out_tick = per_tick("output_tokens")
        cost_win = _trailing_sum(cost_tick, window_ticks)
        out_win = _trailing_sum(out_tick.astype(np.float64), window_ticks)
        replicas = col("replicas_active")
        serving = replicas + col("replicas_draining")
        total_blocks = col("kv_total_blocks")
        data = {
            "t_us": col("t_us"),
            "pool": [plan.name] * len(gpus),
            "replicas_active": replicas.astype(np.int32),
            "replicas_loading": col("replicas_loading").astype(np.int32),
            "replicas_draining": col("replicas_draining").astype(np.int32),
            "gpus": gpus.astype(np.int32),
            "waiting": col("waiting").astype(np.int32),
            "held": col("held").astype(np.int32),  # of waiting: held at the pool, on no replica yet
            "running": col("running").astype(np.int32),
            "kv_usage": np.where(total_blocks > 0, col("kv_used_blocks") / np.maximum(total_blocks, 1), 0.0),
            "kv_used_blocks": col("kv_used_blocks"),
            "kv_total_blocks": total_blocks,
            "arrivals": per_tick("arrivals").astype(np.int32),
            "finished": per_tick("finished").astype(np.int32),
            "rejected": per_tick("rejected").astype(np.int32),
            "preemptions": per_tick("preemptions").astype(np.int32),
            "prompt_tokens_per_s": per_tick("prefill_tokens") / tick_s,
            "output_tokens_per_s": out_tick / tick_s,
            "gpu_busy": np.where(serving > 0, np.minimum(per_tick("busy_us") / np.maximum(serving * raw.tick_us, 1), 1.0), 0.0),
            "cost_usd": np.cumsum(cost_tick),
            "cost_per_mtok_out_usd": np.where(out_win > 0, cost_win / np.maximum(out_win, 1) * 1e6, np.nan),
        }
        pool_reqs = served_by(slim, plan.name)
        data.update(_window_stats(col("t_us"), pool_reqs, window_ticks * raw.tick_us, SPAN_ROWS))
        frames.append(pl.DataFrame(data).with_columns(pl.col(pl.Float64).fill_nan(None)))
    return pl.concat(frames).sort(["t_us", "pool"], maintain_order=True).select(TICK_COLUMNS)


def served_by(requests: pl.DataFrame, pool: str) -> pl.DataFrame:
    """The requests a pool served: those routed to it, and those it prefilled for another."""
    return requests.filter((pl.col("pool") == pool) | (pl.col("prefill_pool") == pool).fill_null(False))


def _trailing_sum(values: np.ndarray, window: int) -> np.ndarray:
    c = np.concatenate(([0.0], np.cumsum(values, dtype=np.float64)))
    idx = np.arange(1, len(values) + 1)
    return c[idx] - c[np.maximum(idx - window, 0)]


def event_frame(raw: RawRun) -> pl.DataFrame:
    """The engine's events and the control plane's (lifecycle, scaling), ordered by time."""
    ev = raw.events
    pool_names = [p.name for p in raw.plans]
    rep_pool = np.repeat(np.arange(len(raw.plans)), [int(n) for n in raw.replica_slots])
    req_pool = raw.pool_index[ev["request"]] if len(ev["request"]) else np.zeros(0, np.int64)
    pool_of = np.where(ev["replica"] >= 0, rep_pool[np.maximum(ev["replica"], 0)], req_pool)
    kinds = np.array(EVENT_NAMES, dtype=object)[ev["kind"]] if len(ev["kind"]) else np.zeros(0, object)
    details = [_detail(k, r, v) for k, r, v in zip(ev["kind"].tolist(), ev["request"].tolist(), ev["value"].tolist())]
    schema = EVENTS.dtypes
    engine_events = pl.DataFrame(
        {
            "t_us": ev["t_us"],
            "pool": [pool_names[i] for i in pool_of.tolist()],
            "replica": pl.Series(ev["replica"], dtype=pl.Int32).replace(-1, None),
            "kind": kinds.tolist(),
            "detail": details,
            "request_id": ev["request"],
        },
        schema=schema,
    )
    ce = raw.control_events
    control = pl.DataFrame(
        {"t_us": ce.t_us, "pool": ce.pool, "replica": ce.replica, "kind": ce.kind, "detail": ce.detail,
         "request_id": [None] * len(ce.t_us)},
        schema=schema,
    )
    return pl.concat([control, engine_events]).sort("t_us", maintain_order=True)


def _detail(kind: int, request: int, value: int) -> str:
    name = EVENT_NAMES[kind]
    if name == "reject":
        return f"request {request}: {REJECT_NAMES[value]}"
    if name == "preempt":
        return f"request {request}: recompute after {value} output tokens"
    if name == "preempt_swap":
        return f"request {request}: KV swapped to host memory after {value} output tokens"
    if name == "arrive" and value > 0:
        return f"request {request}: KV arrived from prefill replica {value - 1}"
    if name == "schedule":
        return f"request {request}: admitted with {value} cached tokens"
    return f"request {request}"


def linear_quantiles(values: np.ndarray, qs) -> list[float]:
    """Quantiles of `values` (not empty) at each of `qs`, from one sort: what polars'
    `Series.quantile(q, interpolation="linear")` gives, float for float (its rank
    pos = (n - 1) * q, the values either side of it as float64, lower + (upper - lower) * (pos - floor)),
    in a third of its time for three quantiles (it selects afresh for each; numpy's sort is vectorised)."""
    ordered = np.sort(values)
    n = len(ordered)
    out = []
    for q in qs:
        pos = (n - 1) * q
        j = int(pos)
        lower, upper = float(ordered[j]), float(ordered[j + 1 if pos > j else j])
        out.append(lower if lower == upper else lower + (upper - lower) * (pos - j))
    return out


FINISHED = pl.col("status") == "finished"
SERVED = pl.col("ttft_us").is_not_null()  # a first token (ttft_us = first_token_us - arrival_us)
# Which requests each latency's percentiles cover, and the percentiles summary.json gives of it.
PERCENTILES = {"ttft": (SERVED, (50, 90, 99)), "tpot": (FINISHED, (50, 99)), "e2e": (FINISHED, (50, 99))}


def _ms(values: list[float], count: int) -> list[float | None]:
    """Percentiles in microseconds as summary.json gives them: ms to 3 places, None of no values."""
    return [round(v / 1000, 3) for v in values] if values else [None] * count


def service_figures(reqs: pl.DataFrame | pl.LazyFrame, span_s: float) -> dict:
    """What the users of a set of requests saw: counts, latency percentiles, SLO attainment.
    Read from the rows lazily, a few columns at a time (a day's rows need not fit in memory)."""
    lf = reqs.lazy()
    counts = lf.select(requests=pl.len(), finished=FINISHED.sum(), rejected=(pl.col("status") == "rejected").sum(),
                       unfinished=(pl.col("status") == "unfinished").sum(), met=pl.col("slo_met").sum(),
                       ).collect(engine="streaming").row(0, named=True)
    reasons = lf.select("reject_reason").drop_nulls().group_by("reject_reason").len().collect(engine="streaming")
    # Exact percentiles without holding the column: a few passes of its rows (replay/fleet/selection.py)
    found = exact_quantiles(lf, {name: (pl.when(among).then(pl.col(f"{name}_us")), [q / 100 for q in qs])
                                 for name, (among, qs) in PERCENTILES.items()})
    n, met = int(counts["requests"]), int(counts["met"] or 0)
    return {
        "requests": n,
        "finished": int(counts["finished"] or 0),
        "rejected": int(counts["rejected"] or 0),
        "unfinished": int(counts["unfinished"] or 0),
        "rejected_by_reason": {str(r): int(c) for r, c in sorted(reasons.iter_rows(), key=lambda rc: (-rc[1], rc[0]))},
        # which requests the percentiles below cover
        **{f"{name}_requests": found[name][0] for name in PERCENTILES},
        **{f"{name}_p{q}_ms": v for name, (_, qs) in PERCENTILES.items()
           for q, v in zip(qs, _ms(found[name][1], len(qs)))},
        "slo_attainment": round(met / n, 4) if n else None,
        "goodput_rps": round(met / span_s, 4) if span_s > 0 else None,
    }


def summarize(requests: pl.DataFrame | pl.LazyFrame, ticks: pl.DataFrame, raw: RawRun, span_s: float) -> dict:
    """Fleet-level, per-pool and per-workload figures of summary.json (cost is per pool: a
    workload sharing a pool has no cost of its own). A pool's prefix hit rate is its own cache's
    hits over the prompts it admitted: KV that arrived from a prefill pool is no hit. The rows
    are read lazily, a few columns at a time."""
    requests = requests.lazy()
    prefill_decode = "prefill_end_us" in requests.collect_schema()  # a frame of a few columns may lack them

    fleet_service = service_figures(requests, span_s)

    def service(reqs: pl.LazyFrame) -> dict:
        """A part of the requests that holds all of them (the only pool, the only workload: most
        runs) has the fleet's figures, not read and sorted again."""
        every = reqs.select(pl.len()).collect(engine="streaming").item() == fleet_service["requests"]
        return copy.deepcopy(fleet_service) if every else service_figures(reqs, span_s)

    def block(reqs: pl.LazyFrame, tks: pl.DataFrame, hit: int, query: int, out_tokens: int, figures: dict) -> dict:
        # (Int32 columns: polars sums them in Int32, wrapping past 2^31: a day's prompts)
        sums = reqs.select(prompt=pl.col("prompt_tokens").filter(SERVED).cast(pl.Int64).sum(),
                           preemptions=pl.col("preemptions").cast(pl.Int64).sum()
                           ).collect(engine="streaming").row(0, named=True)
        cost = float(tks.group_by("pool").agg(pl.col("cost_usd").last())["cost_usd"].sum()) if tks.height else 0.0
        all_tokens = out_tokens + int(sums["prompt"] or 0)
        gpu_hours = float(tks["gpus"].cast(pl.Int64).sum()) * raw.tick_us / 1e6 / 3600.0
        return {
            **figures,
            "output_tokens_per_s": round(out_tokens / span_s, 2) if span_s > 0 else None,
            "gpu_hours": round(gpu_hours, 4),
            "cost_usd": round(cost, 4),
            "cost_per_mtok_out_usd": round(cost / out_tokens * 1e6, 4) if out_tokens else None,
            "cost_per_mtok_all_usd": round(cost / all_tokens * 1e6, 4) if all_tokens else None,
            "preemptions": int(sums["preemptions"] or 0),
            "prefix_hit_rate": round(hit / query, 4) if query else None,
        }

    tk = raw.ticks
    hits = tk["hit_tokens"][-1]
    queries = tk["query_tokens"][-1]
    outs = tk["output_tokens"][-1]
    fleet = block(requests, ticks, int(hits.sum()), int(queries.sum()), int(outs.sum()), fleet_service)
    pools = {}
    for plan in raw.plans:
        pool_ticks = ticks.filter(pl.col("pool") == plan.name)
        served = served_by(requests, plan.name)  # a prefill pool's are those it prefilled (they decode elsewhere)
        pools[plan.name] = block(served, pool_ticks, int(hits[plan.index]), int(queries[plan.index]),
                                 int(outs[plan.index]), service(served))
        # stable / backlogged / overloaded from the queue's trend over the arrivals (replay/fleet/saturation.py);
        # a prefill pool's load: the prompts it prefilled for another pool
        remote = None if not prefill_decode else requests.filter(
            (pl.col("prefill_pool") == plan.name) & (pl.col("pool") != plan.name)).select(
            pl.col("pool", "prefill_pool").cast(pl.String), "arrival_us", "prefill_end_us").collect()
        pools[plan.name]["saturation"] = classify_pool(pool_ticks, plan.name, requests=remote).to_dict()
    names = requests.select(pl.col("workload").unique()).collect().to_series().to_list()
    workloads = {str(name): service(requests.filter(pl.col("workload") == name))
                 for name in sorted(names)}
    if requests.select(pl.col("prefill_pool").is_not_null().any()).collect().item():
        fleet["prefill_decode"] = transfer_figures(requests)
    return {"fleet": fleet, "pools": pools, "workloads": workloads}


def transfer_figures(requests: pl.DataFrame | pl.LazyFrame) -> dict:
    """Prefill/decode: how many requests were prefilled remotely, how long their KV took to move
    and how long it waited for room on its decode replica first."""
    lf = requests.lazy()
    remote = pl.col("prefill_pool").is_not_null()
    counts = lf.select(remote=remote.sum(), local=(~remote & pl.col("first_scheduled_us").is_not_null()).sum(),
                       ).collect(engine="streaming").row(0, named=True)
    start, end, prefilled = pl.col("kv_transfer_start_us"), pl.col("kv_transfer_end_us"), pl.col("prefill_end_us")
    found = exact_quantiles(lf.filter(remote), {
        "kv_transfer": (pl.when(end.is_not_null()).then(end - start), (0.5, 0.99)),
        "decode_wait": (pl.when(prefilled.is_not_null()).then(start - prefilled), (0.5, 0.99))})
    return {
        "remote_prefills": int(counts["remote"] or 0),
        "local_prefills": int(counts["local"] or 0),
        **{f"{name}_p{q}_ms": v for name in ("kv_transfer", "decode_wait")
           for q, v in zip((50, 99), _ms(found[name][1], 2))},
    }
