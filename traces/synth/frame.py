"""Parts (numpy columns per workload or client) to one canonical trace frame.

A day of ServeGen's m-large mix is 24 M rows, so each column is gathered into arrival order
on its own, in its final dtype, and the parts' copy of it is let go before the next one.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from traces.schema import cast_to_schema
from traces.synth.hashes import list_column


def _labels(values: list[str], codes: np.ndarray, name: str) -> pl.Series:
    # a gather from the few distinct labels: 24 M rows share a few hundred strings
    if len(values) == 1:
        return pl.repeat(values[0], len(codes), dtype=pl.String, eager=True).rename(name)
    return pl.Series(name, values, dtype=pl.String).gather(codes)


def _per_part(values: list, part_of: np.ndarray, dtype) -> np.ndarray:
    """A per-part constant (label code, priority) spread over the rows, in the smallest dtype."""
    return np.asarray(values, dtype)[part_of]


def to_frame(parts: list, source: str) -> pl.DataFrame:
    """All rows sorted by arrival (stable: ties keep the parts' order), in TRACE_SCHEMA, with
    `think_time_us` when any part holds sessions. Empties `parts` as it goes."""
    sizes = np.array([len(p.arrival_us) for p in parts], np.int64)
    arrival = np.concatenate([p.arrival_us for p in parts]) if parts else np.zeros(0, np.int64)
    order = np.argsort(arrival, kind="stable")
    arrival = arrival[order]
    part_of = np.repeat(np.arange(len(parts), dtype=np.int32), sizes)[order]

    def take(name: str, dtype, missing=None) -> np.ndarray:
        chunks = []
        for p, n in zip(parts, sizes, strict=True):
            value = getattr(p, name)
            chunks.append(np.full(n, missing, dtype) if value is None else np.asarray(value, dtype))
            setattr(p, name, None)
        return np.concatenate(chunks)[order]

    tenants = sorted({p.tenant for p in parts})
    workloads = sorted({p.workload for p in parts})
    adapters = sorted({a for p in parts for a in p.adapters})
    frame = pl.DataFrame({
        "arrival_us": arrival,
        "prompt_tokens": take("prompt", np.int32),
        "output_tokens": take("output", np.int32),
        "workload": _labels(workloads, _per_part([workloads.index(p.workload) for p in parts], part_of, np.int32),
                            "workload"),
        "tenant": _labels(tenants, _per_part([tenants.index(p.tenant) for p in parts], part_of, np.int32), "tenant"),
        "priority": _per_part([p.priority for p in parts], part_of, np.int32),
    })
    del arrival
    if adapters:
        for p in parts:  # each part's adapter index to the trace-wide one
            if p.adapter is not None:
                codes = np.array([adapters.index(a) for a in p.adapters] + [-1], np.int32)
                p.adapter = codes[p.adapter]
        code = take("adapter", np.int32, -1)
        frame = frame.with_columns(pl.when(pl.Series(code) >= 0)
                                   .then(_labels(adapters, np.maximum(code, 0), "adapter")).alias("adapter"))
    if any(p.session is not None for p in parts):
        session = pl.Series(take("session", np.int64, -1))
        think = pl.Series(take("think_us", np.int64, -1))
        frame = frame.with_columns(
            pl.when(session >= 0)
            .then(pl.concat_str([pl.col("workload"), pl.lit("-s"), session.cast(pl.String)]))
            .alias("session_id"),
            pl.when(think >= 0).then(think).alias("think_time_us"))
    if any(p.hash_flat is not None for p in parts):
        frame = frame.with_columns(_hash_column(parts, sizes, order))
    return cast_to_schema(frame, source=source)


def _hash_column(parts: list, sizes: np.ndarray, order: np.ndarray) -> pl.Series:
    lengths = np.concatenate([p.hash_len if p.hash_len is not None else np.zeros(n, np.int64)
                              for p, n in zip(parts, sizes, strict=True)])
    flat = np.concatenate([p.hash_flat for p in parts if p.hash_flat is not None]).astype(np.uint64)
    # rows in part order own consecutive runs of `flat`; reorder the runs into arrival order
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    sorted_len = lengths[order]
    run = np.repeat(starts[order], sorted_len) + (np.arange(int(sorted_len.sum()))
                                                   - np.repeat(np.cumsum(sorted_len) - sorted_len, sorted_len))
    return list_column(flat[run], sorted_len, sorted_len > 0)
