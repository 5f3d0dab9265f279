"""What-ifs on a trace, as keys of the `trace: whatif:` section (a sweep addresses them by
dotted path, `trace.whatif.grow_rate`): scale one workload's rate, grow every rate keeping the
duration, inject a burst, grow prompts, add a tenant from a synth spec. Applied in that order,
after the trace's filter and window and before its rate_scale and sample.

Rate growth keeps the trace's own shape: a factor f >= 1 keeps every request and adds f - 1
copies of each (the fraction drawn at random), each copy arriving at a uniform time between its
source's arrival and the next one, so the rate curve and the lengths stay those recorded; f < 1
keeps each request with probability f. Added requests are copies with a fresh prefix-hash
namespace (a copied system prompt is shared among the copies, not with the recorded requests)
and without a session (they are released open-loop).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from common.errors import TraceError

FACTOR_RANGE = (1e-6, 1e3)


def _factor(name: str, value: float) -> None:
    low, high = FACTOR_RANGE
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and low <= value <= high):
        raise ValueError(f"{name}: got {value!r}, expected a factor in [{low:g}, {high:g}]")


@dataclass(frozen=True)
class BurstConfig:
    """The rate in [at_s, at_s + duration_s) of trace time times `factor`."""

    at_s: float
    duration_s: float
    factor: float

    def __post_init__(self):
        if not (math.isfinite(self.at_s) and self.at_s >= 0):
            raise ValueError(f"at_s: got {self.at_s!r}, expected seconds >= 0")
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ValueError(f"duration_s: got {self.duration_s!r}, expected seconds > 0")
        _factor("factor", self.factor)


@dataclass(frozen=True)
class WhatIfConfig:
    scale_workload: dict[str, float] | None = None  # workload label -> rate factor
    grow_rate: float | None = None  # every workload's rate, same duration
    burst: BurstConfig | None = None
    grow_prompts: float | None = None  # every prompt's tokens times this
    add_tenant: str | dict[str, Any] | None = None  # a synth spec (file or mapping) merged in
    seed: int = 0

    def __post_init__(self):
        for label, factor in (self.scale_workload or {}).items():
            _factor(f"scale_workload.{label}", factor)
        if self.scale_workload is not None and not self.scale_workload:
            raise ValueError("scale_workload: an empty mapping (expected workload: factor)")
        for name in ("grow_rate", "grow_prompts"):
            if getattr(self, name) is not None:
                _factor(name, getattr(self, name))


def _renumber(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("request_id"))


def _fresh_hashes(hashes: pl.Series, ns: np.uint64) -> pl.Series:
    """Each id h mapped to h(ns, h): copies share prefixes among themselves, not with the recorded rows."""
    from traces.synth.hashes import block_hash, list_column

    lengths = hashes.list.len().fill_null(0).to_numpy().astype(np.int64)
    flat = hashes.drop_nulls().explode().drop_nulls().to_numpy().astype(np.uint64)
    mapped = block_hash(ns, flat, np.zeros(len(flat), np.uint64))
    return list_column(mapped, lengths, hashes.is_not_null().to_numpy()).rename(hashes.name)


def rescale(frame: pl.DataFrame, eligible: np.ndarray, factor: float, rng: np.random.Generator, ns: np.uint64,
            end_us: int | None = None) -> pl.DataFrame:
    """`frame` with the rate of its `eligible` rows times `factor` (module doc); copies arrive
    before `end_us` (a burst's end) when given."""
    rows = np.flatnonzero(eligible)
    if factor < 1:
        drop = rows[rng.random(len(rows)) >= factor]
        keep = np.ones(frame.height, bool)
        keep[drop] = False
        return _renumber(frame.filter(pl.Series(keep)))
    copies = np.floor(factor - 1 + rng.random(len(rows))).astype(np.int64)
    source = np.repeat(rows, copies)
    if len(source) == 0:
        return frame
    arrival = frame["arrival_us"].to_numpy()[rows]
    mean_gap = (arrival[-1] - arrival[0]) / max(len(rows) - 1, 1)
    nxt = np.append(arrival[1:], (end_us if end_us is not None else arrival[-1] + mean_gap))
    gap = np.repeat(nxt - arrival, copies)
    at = np.repeat(arrival, copies) + np.floor(rng.random(len(source)) * gap).astype(np.int64)
    added = frame[source].with_columns(
        pl.Series("arrival_us", at, dtype=pl.Int64), pl.lit(None, dtype=pl.String).alias("session_id"),
        _fresh_hashes(frame["prefix_hashes"][source], ns))
    if "think_time_us" in added.columns:
        added = added.with_columns(pl.lit(None, dtype=pl.Int64).alias("think_time_us"))
    return _renumber(pl.concat([frame, added]).sort("arrival_us", maintain_order=True))


def grow_prompts(frame: pl.DataFrame, factor: float, block_tokens: int | None, ns: np.uint64) -> pl.DataFrame:
    """Every prompt times `factor` (at least 1 token); a hash list gets fresh ids for the blocks
    the prompt grew by (the recorded blocks keep theirs) or loses those it shrank by."""
    from traces.synth.hashes import block_hash

    prompt = np.maximum(np.rint(frame["prompt_tokens"].to_numpy() * factor), 1).astype(np.int64)
    if prompt.max() > 2**31 - 1:
        raise TraceError(f"trace.whatif.grow_prompts={factor:g}: a prompt would pass 2^31 tokens")
    out = frame.with_columns(pl.Series("prompt_tokens", prompt, dtype=pl.Int32))
    hashes = frame["prefix_hashes"]
    if block_tokens is None or hashes.null_count() == frame.height:
        return out
    from traces.synth.hashes import list_column

    has = hashes.is_not_null().to_numpy()
    old = hashes.list.len().fill_null(0).to_numpy().astype(np.int64)
    new = np.where(has, -(-prompt // block_tokens), 0)
    flat = hashes.drop_nulls().explode().drop_nulls().to_numpy().astype(np.uint64)
    # each row's run of ids: its first min(old, new) recorded ids, then fresh ones for the rest
    row = np.repeat(np.arange(len(new)), new)
    index = np.arange(int(new.sum())) - np.repeat(np.cumsum(new) - new, new)
    recorded = index < old[row]
    starts = np.cumsum(old) - old
    out_flat = np.empty(len(row), np.uint64)
    out_flat[recorded] = flat[starts[row[recorded]] + index[recorded]]
    fresh = ~recorded
    out_flat[fresh] = block_hash(ns, row[fresh].astype(np.uint64), index[fresh].astype(np.uint64))
    return out.with_columns(list_column(out_flat, new, has))


def apply_whatif(trace, cfg: WhatIfConfig, base_dir):
    """`trace` (a LoadedTrace) with every what-if of `cfg`, in the module doc's order."""
    from traces.synth.hashes import namespace

    frame = trace.frame
    rng = np.random.default_rng([cfg.seed, 14])
    for label, factor in (cfg.scale_workload or {}).items():
        mask = (frame["workload"] == label).to_numpy()
        if not mask.any():
            present = ", ".join(sorted(frame["workload"].unique().to_list()))
            raise TraceError(f"{trace.source}: trace.whatif.scale_workload.{label}: no request of workload "
                             f"{label!r}; the trace's workloads: {present}")
        frame = rescale(frame, mask, factor, rng, namespace("whatif", cfg.seed, "scale", label))
    if cfg.grow_rate is not None:
        frame = rescale(frame, np.ones(frame.height, bool), cfg.grow_rate, rng, namespace("whatif", cfg.seed, "grow"))
    if cfg.burst is not None:
        b = cfg.burst
        start, end = round(b.at_s * 1e6), round((b.at_s + b.duration_s) * 1e6)
        arrival = frame["arrival_us"].to_numpy()
        mask = (arrival >= start) & (arrival < end)
        if not mask.any():
            raise TraceError(f"{trace.source}: trace.whatif.burst: no request arrives in [{b.at_s:g}, "
                             f"{b.at_s + b.duration_s:g}) s (the trace spans {arrival[-1] / 1e6:,.1f} s)")
        frame = rescale(frame, mask, b.factor, rng, namespace("whatif", cfg.seed, "burst"), end_us=end)
    if cfg.grow_prompts is not None:
        frame = grow_prompts(frame, cfg.grow_prompts, trace.prefix_block_tokens, namespace("whatif", cfg.seed, "prompts"))
    return dataclasses.replace(trace, frame=frame)


def tenant_spec(cfg: WhatIfConfig, trace, base_dir):
    """The add_tenant spec with what it leaves out taken from `trace`: its span as duration_s,
    its hash block size, and a namespace of its own (so its prefixes are fresh)."""
    from pathlib import Path

    from common.yamlfile import read_yaml
    from traces.synth.spec import parse_spec

    spec, folder, name = cfg.add_tenant, Path(base_dir) if base_dir else None, "trace.whatif.add_tenant"
    if isinstance(spec, str):
        path = Path(spec).expanduser()
        path = path if path.is_absolute() or folder is None else folder / path
        if not path.is_file():
            raise TraceError(f"trace.whatif.add_tenant: {spec}: no such spec file")
        spec, folder, name = read_yaml(path, "synth spec"), path.parent, str(spec)
    if not isinstance(spec, dict):
        raise TraceError(f"{name}: expected a mapping (a synth spec)")
    arrival = trace.frame["arrival_us"]
    defaults = {"duration_s": max((int(arrival[-1]) - int(arrival[0])) / 1e6, 1.0),
                "namespace": f"whatif.add_tenant.{cfg.seed}"}
    if trace.prefix_block_tokens is not None:
        defaults["prefix_block_tokens"] = trace.prefix_block_tokens
    parsed = parse_spec({**defaults, **spec}, name)
    if trace.prefix_block_tokens is not None and parsed.prefix_block_tokens != trace.prefix_block_tokens:
        raise TraceError(f"{name}: prefix_block_tokens={parsed.prefix_block_tokens}, expected the trace's "
                         f"{trace.prefix_block_tokens} (or leave it out)")
    return parsed, folder, name
