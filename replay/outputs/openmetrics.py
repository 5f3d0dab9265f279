"""A run's series in the OpenMetrics text format, under the names a real deployment's Prometheus
scrapes (vLLM's `vllm:*`, kube-state-metrics' replica count, DCGM's GPU utilisation), so that
`promtool tsdb create-blocks-from openmetrics` backfills a replay beside the incident it replays
and one dashboard (replay/outputs/grafana/llm-replay.json) reads both.

Where each series comes from (README "Export"):
- per pool, from ticks.parquet: the gauges, the token and preemption counters, the replica count
  and the GPU utilisation (the run records these per pool, not per replica);
- per pool and replica, from requests.parquet: the latency histograms and the success counter,
  each request counted at the tick its first token (TTFT) or its finish (the rest) falls in.

A sample's timestamp is the wall-clock start plus the tick's trace time; a tick row at `t_us`
covers the interval ending there, as a scrape at that instant would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TextIO

import numpy as np
import polars as pl

# vLLM's bucket boundaries, vllm/v1/metrics/loggers.py PrometheusStatLogger.__init__
# (histogram_time_to_first_token, histogram_time_per_output_token, request_latency_buckets for
# histogram_e2e_time_request). Later releases publish the per-token gaps as
# vllm:inter_token_latency_seconds on the same boundaries as time_per_output_token.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)

# (family, help, ticks.parquet expression or counter column): the per-pool series.
POOL_GAUGES = (
    ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", pl.col("waiting")),
    ("vllm:num_requests_running", "Number of requests in model execution batches.", pl.col("running")),
    ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", pl.col("kv_usage")),
)
POOL_COUNTERS = (
    ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", "preemptions"),
    ("vllm:prompt_tokens", "Number of prefill tokens processed.", "prompt_tokens"),
    ("vllm:generation_tokens", "Number of generation tokens processed.", "generation_tokens"),
)
REPLICAS = "kube_deployment_status_replicas"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
SUCCESS = "vllm:request_success"
HISTOGRAMS = (
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", E2E_BUCKETS),
)


@dataclass(frozen=True)
class RunTables:
    ticks: pl.DataFrame
    requests: pl.DataFrame
    models: dict[str, str]  # pool -> model id (summary.json's pool_plans)
    run: str  # the `run` label


def _labels(**kv: object) -> str:
    def esc(v: object) -> str:
        return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in kv.items()) + "}"


def _num(v: float | int) -> str:
    # integers without a fraction, floats as Python's shortest repr (what prometheus_client writes)
    if isinstance(v, (int, np.integer)) or float(v).is_integer():
        return str(int(v))
    return repr(float(v))


def _le(bound: float) -> str:
    return repr(float(bound))  # "1.0", "2560.0": the le values vLLM's prometheus_client exposes


def _stamps(t_us: np.ndarray, start_us: int) -> list[str]:
    # integer arithmetic, so a timestamp never carries float noise
    return [f"{s // 1_000_000}.{s % 1_000_000:06d}" for s in (start_us + t_us).tolist()]


def _tick_counters(pool_ticks: pl.DataFrame) -> pl.DataFrame:
    """Cumulative counters of one pool's ticks: the per-tick rates times the tick's length."""
    dt_s = pool_ticks["t_us"].diff().fill_null(pool_ticks["t_us"][0]) / 1e6
    return pl.DataFrame({
        "preemptions": pool_ticks["preemptions"].cast(pl.Int64).cum_sum(),
        # rates are whole tokens over the tick (replay/fleet/metrics.py): round off the division's noise
        "prompt_tokens": (pool_ticks["prompt_tokens_per_s"] * dt_s).round().cast(pl.Int64).cum_sum(),
        "generation_tokens": (pool_ticks["output_tokens_per_s"] * dt_s).round().cast(pl.Int64).cum_sum(),
    })


def cumulative_histogram(tick_us: np.ndarray, at_us: np.ndarray, values: np.ndarray, weights: np.ndarray,
                         bounds: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Per tick, the cumulative bucket counts (ticks x (bounds + +Inf)) and the sum of what was
    observed at or before it. An observation at `at_us` is counted from the first tick >= at_us;
    one after the last tick is never counted. A bucket holds values <= its bound (`le`)."""
    k = np.searchsorted(tick_us, at_us, side="left")
    keep = k < len(tick_us)
    k, values, weights = k[keep], values[keep], weights[keep]
    b = np.searchsorted(np.asarray(bounds), values, side="left")
    counts = np.zeros((len(tick_us), len(bounds) + 1), dtype=np.int64)
    np.add.at(counts, (k, b), weights)
    sums = np.zeros(len(tick_us))
    np.add.at(sums, k, values * weights)
    return counts.cumsum(axis=0).cumsum(axis=1), sums.cumsum()


def _observations(req: pl.DataFrame) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(at_us, value_s, weight) per histogram family for one replica's requests. The replay keeps
    a request's mean gap between tokens, not each gap: it stands for all output_tokens - 1 of them,
    as vLLM observes one inter-token latency per token after the first."""
    ttft = req.filter(pl.col("first_token_us").is_not_null() & pl.col("ttft_us").is_not_null())
    done = req.filter(pl.col("status") == "finished")
    itl = done.filter(pl.col("tpot_us").is_not_null() & (pl.col("output_tokens") > 1))
    ones = np.ones
    return {
        "vllm:time_to_first_token_seconds": (ttft["first_token_us"].to_numpy(), ttft["ttft_us"].to_numpy() / 1e6,
                                             ones(ttft.height, dtype=np.int64)),
        "vllm:inter_token_latency_seconds": (itl["finished_us"].to_numpy(), itl["tpot_us"].to_numpy() / 1e6,
                                             (itl["output_tokens"] - 1).to_numpy().astype(np.int64)),
        "vllm:e2e_request_latency_seconds": (done["finished_us"].to_numpy(), done["e2e_us"].to_numpy() / 1e6,
                                             ones(done.height, dtype=np.int64)),
    }


def _header(out: TextIO, family: str, kind: str, help_text: str) -> None:
    out.write(f"# TYPE {family} {kind}\n# HELP {family} {help_text}\n")


def _replicas(req: pl.DataFrame) -> list[tuple[str, int, pl.DataFrame]]:
    """(pool, replica, its requests) for every replica that served a request."""
    served = req.filter(pl.col("replica").is_not_null())
    return [(p, int(r), g) for (p, r), g in sorted(served.group_by(["pool", "replica"]), key=lambda x: x[0])]


def write_openmetrics(out: TextIO, tables: RunTables, start_us: int, keep: np.ndarray | None = None) -> None:
    """Write the whole exposition, `# EOF` last. `keep`: the tick times (t_us) to write (every
    tick when None); counters and histograms still count everything up to each kept tick."""
    ticks = tables.ticks.sort(["pool", "t_us"])
    pools = sorted(set(ticks["pool"]))
    model = tables.models
    grid = np.unique(ticks["t_us"].to_numpy())
    rows = grid if keep is None else grid[np.isin(grid, keep)]

    per_pool = {p: ticks.filter(pl.col("pool") == p) for p in pools}
    for family, help_text, expr in POOL_GAUGES:
        _header(out, family, "gauge", help_text)
        for p in pools:
            _series(out, family, _labels(model_name=model.get(p, ""), pool=p, run=tables.run),
                    per_pool[p].select("t_us", expr.alias("v")), rows, start_us)
    for family, help_text, column in POOL_COUNTERS:
        _header(out, family, "counter", help_text)
        for p in pools:
            frame = pl.DataFrame({"t_us": per_pool[p]["t_us"], "v": _tick_counters(per_pool[p])[column]})
            _series(out, family + "_total", _labels(model_name=model.get(p, ""), pool=p, run=tables.run),
                    frame, rows, start_us)
    _header(out, REPLICAS, "gauge", "The number of replicas per deployment.")
    for p in pools:
        # kube-state-metrics reports the Deployment's status.replicas: its pods that are not being
        # deleted (kubernetes pkg/controller/controller_utils.go IsPodActive, which the ReplicaSet
        # controller's syncReplicaSet filters with), so starting ones count and draining ones
        # (terminating, with a deletionTimestamp) do not.
        frame = per_pool[p].select("t_us", (pl.col("replicas_active") + pl.col("replicas_loading")).alias("v"))
        _series(out, REPLICAS, _labels(deployment=p, pool=p, run=tables.run), frame, rows, start_us)
    _header(out, GPU_UTIL, "gauge", "GPU utilization (in %), the pool's mean over its serving replicas.")
    for p in pools:
        _series(out, GPU_UTIL, _labels(pool=p, run=tables.run),
                per_pool[p].select("t_us", (pl.col("gpu_busy") * 100).alias("v")), rows, start_us)
    _request_families(out, tables, grid, rows, start_us)
    out.write("# EOF\n")


def _series(out: TextIO, name: str, labels: str, frame: pl.DataFrame, rows: np.ndarray, start_us: int) -> None:
    frame = frame.filter(pl.col("t_us").is_in(rows) & pl.col("v").is_not_null() & pl.col("v").is_not_nan())
    prefix = f"{name}{labels} "
    out.writelines(f"{prefix}{_num(v)} {ts}\n"
                   for v, ts in zip(frame["v"].to_list(), _stamps(frame["t_us"].to_numpy(), start_us)))


def _request_families(out: TextIO, tables: RunTables, grid: np.ndarray, rows: np.ndarray, start_us: int) -> None:
    replicas = _replicas(tables.requests)
    at = np.isin(grid, rows)
    stamps = _stamps(grid[at], start_us)
    _header(out, SUCCESS, "counter", "Count of successfully processed requests.")
    for p, r, req in replicas:
        done = req.filter(pl.col("status") == "finished")["finished_us"].to_numpy()
        counts = np.searchsorted(np.sort(done), grid, side="right")[at]
        prefix = f"{SUCCESS}_total{_labels(model_name=tables.models.get(p, ''), pool=p, replica=r, run=tables.run)} "
        out.writelines(f"{prefix}{c} {ts}\n" for c, ts in zip(counts.tolist(), stamps))
    observed = [(p, r, _observations(req)) for p, r, req in replicas]
    for family, help_text, bounds in HISTOGRAMS:
        _header(out, family, "histogram", help_text)
        les = [_le(b) for b in bounds] + ["+Inf"]
        for p, r, obs in observed:
            counts, sums = cumulative_histogram(grid, *obs[family], bounds)
            base = dict(model_name=tables.models.get(p, ""), pool=p, replica=r, run=tables.run)
            bucket_prefix = [f"{family}_bucket{_labels(**base, le=le)} " for le in les]
            count_prefix, sum_prefix = f"{family}_count{_labels(**base)} ", f"{family}_sum{_labels(**base)} "
            for row, total, ts in zip(counts[at].tolist(), sums[at].tolist(), stamps):
                out.writelines(f"{bp}{c} {ts}\n" for bp, c in zip(bucket_prefix, row))
                out.write(f"{count_prefix}{row[-1]} {ts}\n{sum_prefix}{_num(total)} {ts}\n")
