"""Synthetic traces: Poisson arrivals with token lengths resampled from a real trace.

Used by the benchmarks (a million requests with the Azure conversation mix) and handy for
capacity questions at rates a recorded trace never reached.
"""

from __future__ import annotations

import hashlib

import numpy as np
import polars as pl

from traces.loader import LoadedTrace
from traces.schema import cast_to_schema


def poisson_trace(
    lengths_from: LoadedTrace, *, requests: int, rate_rps: float, seed: int = 0, workload: str | None = None,
) -> LoadedTrace:
    """`requests` arrivals at `rate_rps` (exponential gaps, whole microseconds), each taking the
    (prompt, output) pair of a random row of `lengths_from`. Deterministic for a seed."""
    if requests < 1:
        raise ValueError(f"requests: got {requests}, expected >= 1")
    if not rate_rps > 0:
        raise ValueError(f"rate_rps: got {rate_rps}, expected > 0")
    rng = np.random.default_rng(seed)
    gaps = np.rint(rng.exponential(1e6 / rate_rps, requests)).astype(np.int64)
    gaps[0] = 0
    rows = rng.integers(0, lengths_from.frame.height, requests)
    src = lengths_from.frame
    frame = pl.DataFrame(
        {
            "arrival_us": np.cumsum(gaps),
            "prompt_tokens": src["prompt_tokens"].to_numpy()[rows],
            "output_tokens": src["output_tokens"].to_numpy()[rows],
            "workload": workload or f"synthetic-{src['workload'][0]}",
        }
    )
    tag = f"poisson:{lengths_from.sha256}:{requests}:{rate_rps}:{seed}"
    return LoadedTrace(
        frame=cast_to_schema(frame, source=tag),
        source=f"poisson({requests} requests at {rate_rps} req/s, lengths of {lengths_from.source})",
        format="synthetic",
        prefix_block_tokens=None,
        sha256=hashlib.sha256(tag.encode()).hexdigest(),
        dropped={},
        reordered=0,
    )
