"""What an observed export pins of a fleet config, as config keys (`llm-replay calibrate --observed`).

- The KV block count: `vllm:cache_config_info`'s `num_gpu_blocks` label is vLLM's
  CacheConfig.num_gpu_blocks (vllm/v1/metrics/loggers.py PrometheusStatLogger.log_metrics_info
  exports the cache config's fields as labels), the blocks of one engine, which
  `engine.num_gpu_blocks_override` sets (vLLM's --num-gpu-blocks-override, as
  vllm/v1/core/kv_cache_utils.py get_num_blocks applies it); compared with the plan's blocks per
  replica.
- Replica counts: kube_deployment_status_replicas over the window. A count that never changed
  pins `replicas` (and an autoscaled pool's bounds at it); one that changed pins the initial
  `replicas` and an autoscaler's `min_replicas` / `max_replicas`; when each side first changed
  its count is reported, not turned into a key (no one key sets a scaler's reaction time).
- The PromQL windows: `rate()` needs two samples in its range, and Prometheus' own advice is a
  range of at least four scrape intervals; a gauge's lookback must reach the previous scrape.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np
import polars as pl


@dataclasses.dataclass(frozen=True)
class Suggestion:
    pool: int | None   # index into pools, None for the observed: section
    key: str           # under the pool (engine.num_gpu_blocks_override) or under observed:
    value: Any
    why: str

    @property
    def path(self) -> str:
        return f"observed.{self.key}" if self.pool is None else f"pools[{self.pool}].{self.key}"


def _changes(values: np.ndarray, times: np.ndarray) -> list[tuple[float, float, float]]:
    """(when, before, after) of each change of a count series, its missing ticks skipped."""
    keep = np.isfinite(values)
    v, t = np.round(values[keep]), times[keep]
    at = np.flatnonzero(np.diff(v) != 0) + 1
    return [(float(t[i]), float(v[i - 1]), float(v[i])) for i in at]


def kv_blocks(pool: int, name: str, observed: Sequence[int], replayed: int) -> tuple[list[Suggestion], list[str]]:
    if not observed:
        return [], []
    notes = []
    if len(observed) > 1:
        notes.append(f"pool {name}: replicas report different num_gpu_blocks ({', '.join(map(str, sorted(observed)))}); "
                     "the smallest is suggested")
    value = int(min(observed))
    if value == replayed:
        return [], notes
    return [Suggestion(pool, "engine.num_gpu_blocks_override", value,
                       f"observed num_gpu_blocks {value:,} per replica, the replay sized {replayed:,}")], notes


def replicas(pool: int, name: str, plan_config: Any, observed: np.ndarray, replayed: np.ndarray,
             times: np.ndarray) -> tuple[list[Suggestion], list[str]]:
    """Keys for pools[pool] from its observed replica count (on the grid), and the timing note."""
    finite = observed[np.isfinite(observed)]
    if not len(finite):
        return [], []
    first, lo, hi = (int(round(float(x))) for x in (finite[0], finite.min(), finite.max()))
    scaler = plan_config.autoscaler
    out, notes = [], []
    if plan_config.replicas != first:
        out.append(Suggestion(pool, "replicas", first, f"observed {first} replica{'s' * (first != 1)} at the start, "
                              f"the config starts {plan_config.replicas}"))
    if scaler is not None:
        for key, want, now in (("min_replicas", lo, scaler.min_replicas), ("max_replicas", hi, scaler.max_replicas)):
            if want != now:
                out.append(Suggestion(pool, f"autoscaler.{key}", want,
                                      f"observed between {lo} and {hi} replicas, the autoscaler allows "
                                      f"{scaler.min_replicas} to {scaler.max_replicas}"))
    elif lo != hi:
        notes.append(f"pool {name}: observed between {lo} and {hi} replicas, the pool has a fixed count: give it an "
                     f"autoscaler with min_replicas {lo} and max_replicas {hi}")
    notes += _timing(name, _changes(observed, times), _changes(replayed, times))
    return out, notes


def _timing(name: str, seen: list, ran: list) -> list[str]:
    if not seen and not ran:
        return []
    fmt = (lambda c: f"{c[0]:,.0f} s ({c[1]:.0f} -> {c[2]:.0f})")
    if not ran:
        return [f"pool {name}: the observed replica count first changed at {fmt(seen[0])}, the replay's never did"]
    if not seen:
        return [f"pool {name}: the replay's replica count first changed at {fmt(ran[0])}, the observed one never did"]
    lag = ran[0][0] - seen[0][0]
    when = "at the same time" if lag == 0 else f"{abs(lag):,.0f} s {'later' if lag > 0 else 'earlier'}"
    return [f"pool {name}: the observed replica count first changed at {fmt(seen[0])}, the replay's at "
            f"{fmt(ran[0])}: {when}; {len(seen)} observed changes, {len(ran)} replayed"]


def scrape_interval_s(samples: pl.DataFrame, series: pl.DataFrame) -> float | None:
    """The longest median gap between samples of one used series: the export's scrape interval."""
    used = series.filter(pl.col("kind") != "info")["series"]
    gaps = (samples.filter(pl.col("series").is_in(used.implode())).sort("series", "t")
            .group_by("series").agg(pl.col("t").diff().median().alias("gap"))["gap"].drop_nulls())
    return float(gaps.max()) if len(gaps) else None


def windows(config: Any, scrape_s: float | None) -> list[Suggestion]:
    if scrape_s is None or scrape_s <= 0:
        return []
    out = []
    want = float(math.ceil(4 * scrape_s))
    if config.rate_window_s < 2 * scrape_s:
        out.append(Suggestion(None, "rate_window_s", want, f"samples come every {scrape_s:g} s: rate() over "
                              f"{config.rate_window_s:g} s sees fewer than two (at least 4 scrape intervals)"))
    if config.lookback_s < scrape_s:
        out.append(Suggestion(None, "lookback_s", float(math.ceil(2 * scrape_s)),
                              f"samples come every {scrape_s:g} s, a gauge's lookback of {config.lookback_s:g} s "
                              "misses every other tick"))
    return out


def apply(cfg: Any, suggestions: Sequence[Suggestion]) -> Any:
    """`cfg` (a FleetConfig) with the suggested keys set; validation errors are the config's own."""
    pools = list(cfg.pools)
    observed = cfg.observed
    top = {s.key: s.value for s in suggestions if s.pool is None}
    if top:
        observed = dataclasses.replace(observed, **top)
    for i in sorted({s.pool for s in suggestions if s.pool is not None}):
        # every key of a pool at once: replicas and the autoscaler's bounds are checked together
        changes: dict[str, Any] = {}
        nested: dict[str, dict[str, Any]] = {}
        for s in (s for s in suggestions if s.pool == i):
            head, _, leaf = s.key.rpartition(".")
            (nested.setdefault(head, {}) if head else changes)[leaf] = s.value
        for head, values in nested.items():
            changes[head] = dataclasses.replace(getattr(pools[i], head), **values)
        pools[i] = dataclasses.replace(pools[i], **changes)
    return dataclasses.replace(cfg, pools=type(cfg.pools)(pools), observed=observed)


def as_yaml(suggestions: Sequence[Suggestion], pool_names: Sequence[str]) -> str:
    """The keys as YAML to merge into the config: each pool by name, in the config's order, each
    key with why it is suggested."""
    lines: list[str] = []
    by_pool = sorted({s.pool for s in suggestions if s.pool is not None})
    if by_pool:
        lines.append("pools:")
    for i in by_pool:
        lines.append(f"  - name: {pool_names[i]}   # pools[{i}]")
        nested: dict[str, list[Suggestion]] = {}
        for s in (s for s in suggestions if s.pool == i):
            head, _, leaf = s.key.rpartition(".")
            nested.setdefault(head, []).append(s)
        for head, items in nested.items():
            indent = "    "
            if head:
                lines.append(f"    {head}:")
                indent = "      "
            lines += [f"{indent}{s.key.rpartition('.')[2]}: {_scalar(s.value)}   # {s.why}" for s in items]
    top = [s for s in suggestions if s.pool is None]
    if top:
        lines.append("observed:")
        lines += [f"  {s.key}: {_scalar(s.value)}   # {s.why}" for s in top]
    return "\n".join(lines) + "\n" if lines else ""


def _scalar(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
