"""Observed series to the fleet's pools and replicas, their samples to trace time.

A series' pool comes from its labels (`ObservedConfig.pool_label`, tried in order, each value
looked up in `pools` and then among the pool names); one that maps to no pool is an error, as
is a series with no sample in the trace's window (a wrong `offset_s`, or another day's export).
Samples a little outside the window are kept up to the lookback or rate window before it, which
the first ticks need, and as far after it; further ones are dropped and counted.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from typing import Sequence

import polars as pl

from common.errors import ConfigError, UserError
from traces.observed.config import ObservedConfig
from traces.observed.layout import Scrapes
from traces.observed.metrics import lookup
from traces.observed.samples import Observed, labels_of, number, series_text

# A Deployment's pods are named <deployment>-<pod-template-hash>-<5 characters> (Kubernetes'
# ReplicaSet and pod name generation), a StatefulSet's <name>-<ordinal>.
_DEPLOYMENT_POD = re.compile(r"(.+)-[a-z0-9]{5,10}-[a-z0-9]{5}")
_STATEFUL_POD = re.compile(r"(.+)-\d+")


@dataclasses.dataclass(frozen=True)
class Mapped:
    """`series`: one row per used series (series, metric, signal, kind, combine, scale, pool,
    replica, le, file); `samples`: theirs (layout.Scrapes), times in trace seconds; `gpu_blocks`: pool ->
    the distinct `num_gpu_blocks` of its `vllm:cache_config_info` series; `dropped`: samples
    outside the kept span; `unknown` / `unused`: metric names read and not used, unknown to the
    tool or known but not compared (a histogram's `_sum`, an older alias where the new name is
    also present)."""

    series: pl.DataFrame
    samples: Scrapes
    gpu_blocks: dict[str, tuple[int, ...]]
    dropped: int
    unknown: tuple[str, ...]
    unused: tuple[str, ...]


def pod_owners(pod: str) -> list[str]:
    """The names a pod's controller may have: `chat-7d9f8c6b5-x2x4z` -> `chat`, `db-0` -> `db`."""
    out = []
    for pattern in (_DEPLOYMENT_POD, _STATEFUL_POD):
        match = pattern.fullmatch(pod)
        if match:
            out.append(match.group(1))
    return out


def pool_of(labels: dict[str, str], config: ObservedConfig, pools: Sequence[str]) -> str | None:
    for label in config.pool_label:
        value = labels.get(label)
        if value is None:
            continue
        for candidate in [value, *(pod_owners(value) if label == "pod" else [])]:
            if candidate in config.pools:
                return config.pools[candidate]
            if candidate in pools:
                return candidate
    return None


def select(observed: Observed, config: ObservedConfig, pools: Sequence[str], window: tuple[float, float],
           trace_offset_s: float | None = None) -> Mapped:
    """The used series of `observed`, each with its signal, pool and replica, samples in trace
    seconds. `window`: the trace's (start, end) in trace seconds; `trace_offset_s`: the wall
    time of trace time 0 from the trace's own timestamps, used when `config.offset_s` is null."""
    offset = config.offset_s if config.offset_s is not None else trace_offset_s
    if offset is None:
        raise ConfigError("observed.offset_s: null and the trace has no wall-clock timestamps; expected the "
                          "Unix time of the trace's start (observed samples are in wall time)")
    for key, pool in config.pools.items():
        if pool not in pools:
            raise ConfigError(f"observed.pools.{key}: {pool!r} is not a pool of the fleet (pools: {', '.join(pools)})")
    rows, used_names, unused = [], set(), set()
    blocks: dict[str, set[int]] = {}
    series = observed.series
    for sid, name, labels, file in zip(series["series"].to_list(), series["metric"].to_list(),
                                       labels_of(series), series["file"].to_list()):
        metric, used = lookup(name)
        if metric is None or not used:
            if metric is not None:
                unused.add(name)
            continue
        pool = pool_of(labels, config, pools)
        if pool is None:
            tried = ", ".join(f'{k}="{labels[k]}"' for k in config.pool_label if k in labels) or "none of them present"
            raise UserError(f"{file}: series {series_text(name, labels)} maps to no pool (pool_label "
                            f"{', '.join(config.pool_label)}: {tried}); expected one of the pools "
                            f"{', '.join(pools)}, or an entry in observed.pools")
        if metric.kind == "info":
            value = number(labels.get("num_gpu_blocks", ""))
            if value is not None and value.is_integer():
                blocks.setdefault(pool, set()).add(int(value))
            continue
        # kube-state-metrics' own pod is no replica of the pool it reports on
        replica = next((labels[k] for k in config.replica_label if k in labels), "") if metric.per_replica else ""
        le = number(labels["le"]) if metric.kind == "histogram" else None
        rows.append((sid, name, metric.signal, metric.kind, metric.combine, metric.scale, metric.rank,
                     pool, replica, le, file))
        used_names.add(name)
    frame = pl.DataFrame(rows, orient="row", schema={
        "series": pl.UInt32, "metric": pl.String, "signal": pl.String, "kind": pl.String, "combine": pl.String,
        "scale": pl.Float64, "rank": pl.Int32, "pool": pl.String, "replica": pl.String, "le": pl.Float64,
        "file": pl.String})
    # Of a renamed metric's two names in one pool (vLLM 0.9-0.10 export both), the new one.
    best = frame.group_by("signal", "pool").agg(pl.col("rank").min().alias("best"))
    frame = frame.join(best, on=["signal", "pool"]).sort("series")
    unused |= set(frame.filter(pl.col("rank") > pl.col("best"))["metric"].to_list())
    frame = frame.filter(pl.col("rank") == pl.col("best")).drop("rank", "best")
    used_names = set(frame["metric"].to_list())
    unused -= used_names
    samples, dropped = _in_window(observed.samples, frame, offset, window, max(config.lookback_s, config.rate_window_s))
    return Mapped(frame, samples, {p: tuple(sorted(b)) for p, b in sorted(blocks.items())}, dropped,
                  observed.unknown, tuple(sorted(unused)))


def _in_window(samples: pl.DataFrame, frame: pl.DataFrame, offset: float, window: tuple[float, float],
               margin: float) -> tuple[Scrapes, int]:
    start, end = window
    kept = samples.filter(pl.col("series").is_in(frame["series"].implode())) \
        .with_columns(t=pl.col("t") - offset)
    inside = kept.filter(pl.col("t").is_between(start - margin, end + margin))
    present = set(inside["series"].unique().to_list())
    missing = frame.filter(~pl.col("series").is_in(list(present)))
    if missing.height:
        row = missing.row(0, named=True)
        span = kept.filter(pl.col("series") == row["series"])["t"]
        when = (f"from {_wall(span.min() + offset)} to {_wall(span.max() + offset)}" if len(span) else "none")
        raise UserError(f"{row['file']}: series {row['metric']} (pool {row['pool']}, replica {row['replica'] or '-'}): "
                        f"samples {when}, none within the trace's window {_wall(start + offset)} to "
                        f"{_wall(end + offset)} (offset_s {offset:.0f}); expected timestamps in the window")
    ids = int(frame["series"].max()) + 1 if frame.height else 0
    return Scrapes.from_frame(inside, ids), kept.height - inside.height


def _wall(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
