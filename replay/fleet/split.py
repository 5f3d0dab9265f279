"""What the replay takes from the trace's columns besides their values, the same for a whole
frame (replay/fleet/cluster.py `simulate`) and for one batch of a trace read in batches
(replay/fleet/streamed.py): each request's pool by the fleet's split, and its prefix hashes as
the engine indexes them (one flat array, an offset and a length a request).
"""

from __future__ import annotations

import reprlib
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from common.errors import ConfigError
from policies.registry import split_function
from replay.config import FleetConfig

if TYPE_CHECKING:
    from replay.fleet.cluster import PoolPlan


def split_requests(frame: pl.DataFrame, cfg: FleetConfig, plans: list[PoolPlan], source: str = "config") -> np.ndarray:
    """Pool index of every request of `frame` (the whole trace; or a batch of it, once
    `assign_pools` has checked every label of the trace), by the fleet's split policy. Under
    prefill-decode every request arrives at the decode pool, which sends its prefill to the
    prefill pool (cluster.pd_inputs)."""
    if cfg.split.policy == "prefill-decode":
        _, decode = cfg.split.pd_pools([p.name for p in cfg.pools])
        return np.full(frame.height, decode, np.int64)
    if cfg.split.policy == "by-prompt-length":
        thresholds = np.asarray(cfg.split.prompt_thresholds, np.int64)
        return np.searchsorted(thresholds, frame["prompt_tokens"].to_numpy(), side="right").astype(np.int64)
    if cfg.split.policy == "by-workload":
        return assign_pools(frame["workload"], plans, source)
    return user_split(frame, cfg.split.policy, [p.name for p in plans], source)


def user_split(frame: pl.DataFrame, name: str, pools: list[str], source: str = "config") -> np.ndarray:
    """A user's split function on the trace; a result that sends a request to no pool is a
    config error naming the request."""
    fn = split_function(name, "split.policy", source)
    result = fn(frame, list(pools))
    values = result.to_numpy() if isinstance(result, pl.Series) else np.asarray(result)
    where = f"{source}: split.policy: {name}"
    if result is None or values.ndim != 1:
        raise ConfigError(f"{where} returned {reprlib.repr(result)}; expected one pool (an index or a name) per "
                          f"request ({frame.height})")
    if values.shape != (frame.height,):
        raise ConfigError(f"{where} returned {values.shape[0]} values; expected one pool per request ({frame.height})")
    if values.dtype.kind in "OUS":  # pool names
        index = {p: i for i, p in enumerate(pools)}
        out = np.array([index.get(v, -1) if isinstance(v, str) else -1 for v in values.tolist()], np.int64)
    elif values.dtype.kind in "iu":
        out = values.astype(np.int64)
    else:
        raise ConfigError(f"{where} returned {values.dtype} values; expected pool indices or pool names")
    bad = np.nonzero((out < 0) | (out >= len(pools)))[0]
    if bad.size:
        i = int(bad[0])
        raise ConfigError(f"{where} sends request {frame['request_id'][i]} to {values[i].item()!r}, which is no pool; "
                          f"expected an index 0..{len(pools) - 1} or a name ({', '.join(pools)})")
    return out


def assign_pools(workloads: pl.Series, plans: list[PoolPlan], source: str = "config") -> np.ndarray:
    """Pool index of every request: the pool that lists its workload, else the catch-all pool."""
    by_label = {label: p.index for p in plans for label in p.config.workloads}
    catch_all = [p.index for p in plans if not p.config.workloads]
    labels = workloads.unique().to_list()
    missing = sorted(str(w) for w in labels if w not in by_label)
    if missing and not catch_all:
        raise ConfigError(
            f"{source}: pools: workload {missing[0]!r} of the trace goes to no pool; list it in a pool's "
            f"'workloads' or add a pool without 'workloads' (trace workloads: {', '.join(sorted(map(str, labels)))})"
        )
    mapping = {w: by_label.get(w, catch_all[0] if catch_all else -1) for w in labels}
    return workloads.replace_strict(mapping, return_dtype=pl.Int64).to_numpy()


def prefix_hash_columns(hashes: pl.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offset, length, the flat array) of every request's prefix hashes (a List(UInt64) column,
    null for none), the offsets into the flat array, which holds the lists one after another."""
    hash_len = hashes.list.len().fill_null(0).to_numpy().astype(np.int64)
    hash_off = np.zeros(len(hash_len), np.int64)
    np.cumsum(hash_len[:-1], out=hash_off[1:])
    # (a null list explodes to one null, as an empty one does: dropped with them; a null entry
    # inside a list too, which the count then finds)
    # a copy, writable: polars' zero-copy view is read-only, and numba types a read-only array apart,
    # so a whole trace's hashes would compile the engine a second time (tests/unit/test_prebuild.py)
    flat = hashes.explode().drop_nulls().to_numpy().astype(np.uint64)
    if len(flat) != int(hash_len.sum()):
        raise ValueError("prefix_hashes contain null entries")
    return hash_off, hash_len, flat
