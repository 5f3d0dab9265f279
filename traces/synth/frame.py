"""Parts (numpy columns per workload or client) to one canonical trace frame."""

from __future__ import annotations

import numpy as np
import polars as pl

from traces.schema import cast_to_schema
from traces.synth.hashes import list_column


def _labels(values: list[str], codes: np.ndarray, name: str) -> pl.Series:
    # a gather from the few distinct labels: 17 M rows share a few hundred strings
    return pl.Series(name, values, dtype=pl.String).gather(codes)


def to_frame(parts: list, source: str) -> pl.DataFrame:
    """All rows sorted by arrival (stable: ties keep the parts' order), in TRACE_SCHEMA, with
    `think_time_us` when any part holds sessions."""
    arrival = np.concatenate([p.arrival_us for p in parts]) if parts else np.zeros(0, np.int64)
    order = np.argsort(arrival, kind="stable")
    sizes = np.array([len(p.arrival_us) for p in parts], np.int64)
    part_of = np.repeat(np.arange(len(parts)), sizes)[order]

    def cat(get, dtype):
        return np.concatenate([np.asarray(get(p), dtype) for p in parts])[order]

    tenants = sorted({p.tenant for p in parts})
    workloads = sorted({p.workload for p in parts})
    adapters = sorted({a for p in parts for a in p.adapters})
    t_code = np.array([tenants.index(p.tenant) for p in parts], np.int64)[part_of]
    w_code = np.array([workloads.index(p.workload) for p in parts], np.int64)[part_of]
    a_code = cat(lambda p: np.where(p.adapter >= 0, np.array([adapters.index(a) for a in p.adapters] + [-1],
                                                             np.int64)[p.adapter], -1), np.int64)
    columns = {
        "arrival_us": arrival[order],
        "prompt_tokens": cat(lambda p: p.prompt, np.int64),
        "output_tokens": cat(lambda p: p.output, np.int64),
        "workload": _labels(workloads, w_code, "workload"),
        "tenant": _labels(tenants, t_code, "tenant"),
        "priority": np.array([p.priority for p in parts], np.int64)[part_of],
        "adapter": _labels(adapters + [""], np.where(a_code >= 0, a_code, len(adapters)), "adapter"),
    }
    frame = pl.DataFrame(columns).with_columns(
        pl.when(pl.col("adapter") == "").then(None).otherwise(pl.col("adapter")).alias("adapter"))
    if any(p.session is not None for p in parts):
        session = cat(lambda p: p.session if p.session is not None else np.full(len(p.arrival_us), -1), np.int64)
        think = cat(lambda p: p.think_us if p.think_us is not None else np.full(len(p.arrival_us), -1), np.int64)
        frame = frame.with_columns(
            pl.when(pl.Series(session) >= 0)
            .then(pl.concat_str([pl.col("workload"), pl.lit("-s"), pl.Series(session).cast(pl.String)]))
            .alias("session_id"),
            pl.when(pl.Series(think) >= 0).then(pl.Series(think)).alias("think_time_us"))
    if any(p.hash_flat is not None for p in parts):
        frame = frame.with_columns(_hash_column(parts, order))
    return cast_to_schema(frame, source=source)


def _hash_column(parts: list, order: np.ndarray) -> pl.Series:
    lengths = np.concatenate([p.hash_len if p.hash_len is not None else np.zeros(len(p.arrival_us), np.int64)
                              for p in parts])
    flat = np.concatenate([p.hash_flat for p in parts if p.hash_flat is not None]).astype(np.uint64)
    # rows in part order own consecutive runs of `flat`; reorder the runs into arrival order
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    sorted_len = lengths[order]
    run = np.repeat(starts[order], sorted_len) + (np.arange(int(sorted_len.sum()))
                                                   - np.repeat(np.cumsum(sorted_len) - sorted_len, sorted_len))
    return list_column(flat[run], sorted_len, sorted_len > 0)
