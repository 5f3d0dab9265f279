"""How far a replayed series is from the observed one on the same tick grid.

Both are averaged over consecutive windows of `window_s` (from the grid's first tick; the last
window may be shorter), over the ticks where both have a value; a window where either has none
is left out. Over those windows:

- `mape`: mean of |replayed - observed| / |observed|, a share (0.12 = 12%). A window whose
  observed mean is exactly 0 (an idle queue) has no relative error and is left out, counted in
  `zero_windows`; `mae`, the mean absolute difference in the signal's unit, covers every window,
  so a replay that queues where the fleet did not still shows. None when no window qualifies.
- `correlation`: Pearson's r of the window means; None with fewer than two windows or when
  either side is constant (r is undefined there).
- `gap`: the largest |replayed - observed| of a window, `gap_at_s` that window's last tick
  (trace seconds), with both values there.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

import numpy as np

from traces.observed.align import Grid


@dataclasses.dataclass(frozen=True)
class Divergence:
    windows: int
    mape: float | None
    zero_windows: int
    mae: float | None
    correlation: float | None
    gap: float | None
    gap_at_s: float | None
    observed_at_gap: float | None
    replayed_at_gap: float | None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def window_means(values: np.ndarray, other: np.ndarray, ticks_per_window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(means of `values`, means of `other`, index of each window's last tick) over the windows
    where both have at least one paired finite value."""
    both = np.isfinite(values) & np.isfinite(other)
    n = len(values)
    starts = np.arange(0, n, ticks_per_window)
    count = np.add.reduceat(both.astype(np.int64), starts) if n else np.zeros(0, np.int64)
    a = np.add.reduceat(np.where(both, values, 0.0), starts) if n else np.zeros(0)
    b = np.add.reduceat(np.where(both, other, 0.0), starts) if n else np.zeros(0)
    keep = count > 0
    last = np.minimum(starts + ticks_per_window, n) - 1
    return a[keep] / count[keep], b[keep] / count[keep], last[keep]


def score(observed: np.ndarray, replayed: np.ndarray, grid: Grid, window_s: float) -> Divergence:
    observed = np.asarray(observed, dtype=np.float64)
    replayed = np.asarray(replayed, dtype=np.float64)
    if observed.shape != (grid.n,) or replayed.shape != (grid.n,):
        raise ValueError(f"observed {observed.shape} and replayed {replayed.shape} must both have the grid's {grid.n} ticks")
    per = max(1, round(window_s / grid.tick_s))
    obs, rep, last = window_means(observed, replayed, per)
    if len(obs) == 0:
        return Divergence(0, None, 0, None, None, None, None, None, None)
    diff = np.abs(rep - obs)
    nonzero = obs != 0
    mape = float(np.mean(diff[nonzero] / np.abs(obs[nonzero]))) if nonzero.any() else None
    corr = None
    if len(obs) >= 2 and np.ptp(obs) > 0 and np.ptp(rep) > 0:
        r = float(np.corrcoef(obs, rep)[0, 1])
        corr = r if math.isfinite(r) else None
    i = int(np.argmax(diff))
    return Divergence(len(obs), mape, int((~nonzero).sum()), float(diff.mean()), corr, float(diff[i]),
                      float(grid.start_s + grid.tick_s * last[i]), float(obs[i]), float(rep[i]))


def score_all(observed: Mapping[tuple, np.ndarray], replayed: Mapping[tuple, np.ndarray], grid: Grid,
              window_s: float) -> dict[tuple, Divergence]:
    """`score` for every key (signal, pool[, replica]) present on both sides, in key order; a key
    on one side only has nothing to be compared with and is left to the caller to report
    (`unmatched`)."""
    return {key: score(observed[key], replayed[key], grid, window_s) for key in sorted(observed) if key in replayed}


def unmatched(observed: Mapping[tuple, np.ndarray], replayed: Mapping[tuple, np.ndarray]) -> tuple[list, list]:
    """(keys only observed, keys only replayed), sorted."""
    return sorted(set(observed) - set(replayed)), sorted(set(replayed) - set(observed))
