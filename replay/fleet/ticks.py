"""The tick bound of a replay: a run keeps one row per tick and pool, so one whose ticks would not
fit in memory and minutes is refused before it starts (or, draining, as it runs), naming the
tick_s that would fit; and the per-tick rows the cluster loop collected, as RawRun.ticks."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import polars as pl

from common.bounds import BY_NAME
from common.errors import ConfigError
from replay.config import FleetConfig
from replay.engine.common import R_ACTIVE, R_DRAINING, R_STARTING, SNAPSHOT_COLUMNS

# Each tick runs a Python control step and keeps a row per pool; measured, a run costs about
# 2 KB of memory and 0.1 ms per tick-pool row (2 requests over 2.5M one-second ticks: 5.6 GB and
# 290 s; 3 pools over 1.2M ticks: 3.6 GB). 1M rows keeps a run near 2 GB and a few minutes, so a
# replay that needs more is refused before it starts, with the tick_s that would fit.
MAX_TICK_POOL_ROWS = 1_000_000
TICK_S_MAX = BY_NAME["tick_s"].hi


def check_tick_count(frame: pl.DataFrame, cfg: FleetConfig) -> None:
    """Refuse a replay whose ticks up to the last arrival (those it certainly steps through)
    times its pools exceed MAX_TICK_POOL_ROWS, naming the tick_s that would fit. The drain after
    it usually ends early (every request done; validation allows 30 days of it), so it is
    bounded as it runs (`check_drain`)."""
    tick_us = max(1, round(cfg.tick_s * 1e6))
    last_s = (int(frame["arrival_us"].max()) if frame.height else 0) / 1e6
    ticks = _ticks(last_s, tick_us)
    pools = len(cfg.pools)
    if ticks * pools <= MAX_TICK_POOL_ROWS:
        return
    fits = _tick_s_that_fits(last_s + cfg.max_drain_s, pools)
    if fits > TICK_S_MAX:  # a long drain allowance cannot fit whole: fit the arrivals
        fits = _tick_s_that_fits(last_s, pools)
    raise ConfigError(
        f"tick_s={cfg.tick_s:g}: the replay would step through {ticks:,} ticks x {pools} pool{'s' * (pools > 1)} = "
        f"{ticks * pools:,} tick rows over {last_s:,.0f} s of trace, more than {MAX_TICK_POOL_ROWS:,} "
        f"(each keeps about 2 KB); raise tick_s to {fits:g} s, or shorten the trace (--window)"
    )


def check_drain(ticks: int, pools: int, tick_us: int, last_arrival_us: int) -> None:
    if ticks * pools > MAX_TICK_POOL_ROWS:
        drained_s = ticks * tick_us / 1e6 - last_arrival_us / 1e6
        raise ConfigError(
            f"tick_s={tick_us / 1e6:g}: the fleet was still draining {drained_s:,.0f} s after the last arrival, "
            f"{ticks:,} ticks x {pools} pool{'s' * (pools > 1)}: more than {MAX_TICK_POOL_ROWS:,} tick rows; "
            "raise tick_s, lower max_drain_s, or add replicas"
        )


def _ticks(seconds: float, tick_us: int) -> int:
    return math.ceil(seconds * 1e6 / tick_us)


def _tick_s_that_fits(seconds: float, pools: int) -> float:
    """The smallest tick_s of one significant digit (2 -> 3 -> ... -> 9 -> 10 -> 20) within the bound."""
    need = seconds * pools / MAX_TICK_POOL_ROWS
    scale = 10.0 ** math.floor(math.log10(need))
    digit = math.ceil(round(need / scale, 9))
    while _ticks(seconds, round(digit * scale * 1e6)) * pools > MAX_TICK_POOL_ROWS:
        digit += 1
    return float(f"{digit * scale:.6g}")


def tick_arrays(snapshots: Sequence[np.ndarray] | np.ndarray, pool_counts: Sequence[np.ndarray] | np.ndarray,
                by_state: Sequence[np.ndarray] | np.ndarray, billed: Sequence[np.ndarray] | np.ndarray,
                tick_us: int) -> dict[str, np.ndarray]:
    """RawRun.ticks from the per-tick rows the cluster loop collected (each a [tick, ...] array,
    or a list of a tick's rows): each column [tick, pool]."""
    per_pool = _stacked(snapshots)  # [tick, pool, column]
    counts = _stacked(pool_counts)
    states = _stacked(by_state)  # [tick, pool, replica state]
    ticks = {name: per_pool[:, :, k] for k, name in enumerate(SNAPSHOT_COLUMNS)}
    ticks["arrivals"], ticks["rejected"], ticks["held"] = counts[:, :, 0], counts[:, :, 1], counts[:, :, 2]
    ntick, npool = per_pool.shape[:2]
    ticks["t_us"] = np.repeat((np.arange(1, ntick + 1) * tick_us)[:, None], npool, axis=1)
    ticks["replicas_loading"] = states[:, :, R_STARTING]
    ticks["replicas_active"] = states[:, :, R_ACTIVE]
    ticks["replicas_draining"] = states[:, :, R_DRAINING]
    ticks["gpus"] = _stacked(billed)
    return ticks


def _stacked(rows: Sequence[np.ndarray] | np.ndarray) -> np.ndarray:
    return rows if isinstance(rows, np.ndarray) else np.stack(rows)
