"""Summary statistics of a canonical trace frame: size, rates, token percentiles, prefix reuse.

Percentiles are nearest-rank; the peak 1-minute rate is the most arrivals in any window
[t, t + 60 s) that starts at an arrival; prefix reuse assumes an infinite cache filled in
arrival order and counts a strict prefix match (stop at the first unseen block).
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

MINUTE_US = 60_000_000
PERCENTILES = (50, 90, 99)


def inspect_trace(trace, *, prefix_block_tokens: int | None = None) -> dict:
    """Statistics of `trace` (a TRACE_SCHEMA frame or a LoadedTrace, whose block size is used)."""
    frame = trace if isinstance(trace, pl.DataFrame) else trace.frame
    if prefix_block_tokens is None and not isinstance(trace, pl.DataFrame):
        prefix_block_tokens = trace.prefix_block_tokens
    rows = frame.height
    arrival = frame["arrival_us"].to_numpy()
    span_us = int(arrival[-1] - arrival[0]) if rows else 0
    peak = peak_window_count(arrival, MINUTE_US)
    counts = frame.group_by("workload").len().sort(["len", "workload"], descending=[True, False])
    return {
        "rows": rows,
        "span_s": span_us / 1e6,
        "mean_rate_rps": rows / (span_us / 1e6) if span_us > 0 else None,
        "peak_1min_requests": peak,
        "peak_1min_rps": peak / 60.0,
        "prompt_tokens": token_stats(frame["prompt_tokens"].to_numpy()),
        "output_tokens": token_stats(frame["output_tokens"].to_numpy()),
        "workloads": dict(counts.iter_rows()),
        "prefix_reuse": prefix_reuse(frame, prefix_block_tokens),
    }


def peak_window_count(arrival_us: np.ndarray, width_us: int) -> int:
    """Most arrivals (sorted int64 us) in any half-open window [t, t + width) with t an arrival."""
    if len(arrival_us) == 0:
        return 0
    ends = np.searchsorted(arrival_us, arrival_us + width_us, side="left")
    return int((ends - np.arange(len(arrival_us))).max())


def nearest_rank(sorted_values: np.ndarray, p: float) -> int:
    """The p-th percentile by nearest rank: the value at rank ceil(p/100 * n), 1-based."""
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return int(sorted_values[rank - 1])


def token_stats(values: np.ndarray) -> dict:
    if len(values) == 0:
        return {"mean": None, "min": None, "max": None, **{f"p{p}": None for p in PERCENTILES}}
    ordered = np.sort(values)
    stats = {f"p{p}": nearest_rank(ordered, p) for p in PERCENTILES}
    return {
        "mean": float(values.astype(np.float64).mean()),
        **stats,
        "min": int(ordered[0]),
        "max": int(ordered[-1]),
    }


def prefix_reuse(frame: pl.DataFrame, block_tokens: int | None) -> dict | None:
    """Reuse of prefix blocks with an infinite cache, in arrival order; None without hashes.

    reused_block_fraction = reused-prefix blocks / all block references;
    reused_prompt_token_fraction = sum(min(prompt, block_tokens * reused blocks)) / sum(prompt),
    None when the block size is unknown.
    """
    hashes = frame["prefix_hashes"]
    if hashes.null_count() == len(hashes):
        return None
    seen: set[int] = set()
    references = reused_blocks = reused_tokens = 0
    prompts = frame["prompt_tokens"].to_list()
    for blocks, prompt in zip(hashes.to_list(), prompts):
        if not blocks:
            continue
        hit = 0
        for block in blocks:
            if block not in seen:
                break
            hit += 1
        references += len(blocks)
        reused_blocks += hit
        if block_tokens is not None:
            reused_tokens += min(prompt, block_tokens * hit)
        seen.update(blocks)
    total_prompt = sum(p for p, b in zip(prompts, hashes.to_list()) if b is not None)
    return {
        "block_tokens": block_tokens,
        "block_references": references,
        "unique_blocks": len(seen),
        "reused_block_fraction": reused_blocks / references if references else 0.0,
        "reused_prompt_token_fraction": (
            reused_tokens / total_prompt if block_tokens is not None and total_prompt else None
        ),
    }
