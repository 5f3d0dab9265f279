"""The `trace:` config section and `load_from_config`: load, merge, then transform.

Order (each step sees the previous one's output): load every source (the main `path`, then each
`merge` entry, each shifted by its `offset_s`) -> merge by arrival -> `filter` -> `window`
(bounds in the merged trace's seconds, re-zeroed) -> `rate_scale` -> `sample`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import pathlib
from typing import Any

import numpy as np

from common.bounds import first_out_of_bounds
from traces.bundled import BUNDLED, DEFAULT_TRACE
from common.errors import TraceError
from traces.generic import CANONICAL, REQUIRED, TIME_UNITS
from traces.limits import DEFAULT_LIMITS, TraceLimits, human_span
from traces.loader import MAX_BLOCK_TOKENS, LoadedTrace, load_trace
from traces.source import FORMATS
from traces.whatif import WhatIfConfig, apply_whatif, tenant_spec
from traces.transforms import (
    MAX_SECONDS, FilterConfig, SampleConfig, WindowConfig, check_rate_scale, filter_rows, merge, sample,
    scale_rate, window,
)  # fmt: skip


def _check_ranges(obj) -> None:
    """After a section's own checks: the range of every number (common/bounds.py), here too
    because CLI flags build these sections without from_dict."""
    for prefix, section in (("", obj), ("window.", obj.window), ("sample.", obj.sample),
                            ("filter.", getattr(obj, "filter", None))):
        problem = first_out_of_bounds(section) if section is not None else None
        if problem is not None:
            key, value, expected = problem
            raise ValueError(f"{prefix}{key}: got {value!r}, expected {expected}")


def _check_source_fields(obj) -> None:
    """Shared checks of the fields TraceConfig and MergeSource have in common."""
    if obj.format is not None and obj.format not in FORMATS:
        raise ValueError(f"format={obj.format!r} is not known; known: {', '.join(FORMATS)}")
    if obj.time_unit is not None and obj.time_unit not in TIME_UNITS:
        raise ValueError(f"time_unit={obj.time_unit!r} is not known; known: {', '.join(TIME_UNITS)}")
    if obj.column_map is not None:
        unknown = sorted(set(obj.column_map) - set(CANONICAL))
        if unknown:
            raise ValueError(f"column_map.{unknown[0]} is not known; known keys: {', '.join(CANONICAL)}")
        missing = [k for k in REQUIRED if k not in obj.column_map]
        if missing:
            raise ValueError(f"column_map needs {', '.join(REQUIRED)}; missing {', '.join(missing)}")
    if obj.prefix_block_tokens is not None and not 1 <= obj.prefix_block_tokens <= MAX_BLOCK_TOKENS:
        raise ValueError(f"prefix_block_tokens={obj.prefix_block_tokens!r} (expected an integer in 1..{MAX_BLOCK_TOKENS:,})")
    if obj.workload is not None and not obj.workload:
        raise ValueError("workload is empty (expected a label, or leave it out)")


@dataclasses.dataclass(frozen=True)
class MergeSource:
    """Another trace merged into the main one; `offset_s` delays all of its arrivals. Its own
    `window`, `rate_scale` and `sample` apply to it alone, before the merge (to mix sources at
    chosen rates); the main section's transforms then apply to the merged stream."""

    path: str
    format: str | None = None
    column_map: dict[str, str] | None = None
    time_unit: str | None = None
    workload: str | None = None
    prefix_block_tokens: int | None = None
    offset_s: float = 0.0
    window: WindowConfig | None = None
    rate_scale: float | None = None
    sample: SampleConfig | None = None

    def __post_init__(self):
        _check_source_fields(self)
        if not math.isfinite(self.offset_s) or not 0 <= self.offset_s <= MAX_SECONDS:
            raise ValueError(f"offset_s={self.offset_s!r} (expected a number of seconds in [0, {MAX_SECONDS:g}])")
        if self.rate_scale is not None:
            check_rate_scale(self.rate_scale)
        _check_ranges(self)


@dataclasses.dataclass(frozen=True)
class TraceConfig:
    """The `trace:` section. `path` None means the bundled default (unless only `merge` is given)."""

    path: str | None = None
    format: str | None = None
    column_map: dict[str, str] | None = None
    time_unit: str | None = None
    workload: str | None = None
    prefix_block_tokens: int | None = None
    window: WindowConfig | None = None
    rate_scale: float | None = None
    sample: SampleConfig | None = None
    filter: FilterConfig | None = None
    merge: tuple[MergeSource, ...] = ()
    # a synth spec (a YAML file, relative to the config, or an inline mapping) instead of `path`
    synthetic: str | dict[str, Any] | None = None
    whatif: WhatIfConfig | None = None  # traces/whatif.py
    # Replay sessions closed-loop: a session's next turn is sent when the replay ends the one
    # before it, plus its think time (replay/fleet/sessions.py); requests without a session_id
    # arrive at their recorded time.
    closed_loop: bool = False

    def __post_init__(self):
        _check_source_fields(self)
        if self.synthetic is not None and self.path is not None:
            raise ValueError("synthetic: give path or synthetic, not both")
        if not isinstance(self.closed_loop, bool):
            raise ValueError(f"closed_loop={self.closed_loop!r} (expected true or false)")
        if self.rate_scale is not None:
            check_rate_scale(self.rate_scale)
        _check_ranges(self)


def _resolve(path: str, base_dir: str | pathlib.Path | None) -> str:
    if path in BUNDLED or base_dir is None or pathlib.Path(path).expanduser().is_absolute():
        return path
    return str(pathlib.Path(base_dir) / path)


def load_from_config(
    cfg: TraceConfig,
    path_override: str | None = None,
    format_override: str | None = None,
    strict: bool = False,
    base_dir: str | pathlib.Path | None = None,
    limits: TraceLimits = DEFAULT_LIMITS,
    stream: bool = False,
) -> LoadedTrace:
    """Load the trace `cfg` describes, merged and transformed in the order of this module's doc.

    Paths in `cfg` are relative to `base_dir` (the config file's folder); `path_override` (a CLI
    argument) replaces `cfg.path` as given, relative to the working directory; `format_override`
    replaces `cfg.format`. `dropped` adds `filtered`, `outside_window` and `sampled_out` counts.
    `limits` bound every file read and the span of the final trace. `stream`: one canonical
    Parquet file that nothing transforms may come read in batches (LoadedTrace.stream).
    """
    main = None
    stream = stream and reads_as_is(cfg)
    loads: list[tuple[LoadedTrace, float]] = []
    if path_override is not None:
        main = str(path_override)
    elif cfg.path is not None:
        main = _resolve(cfg.path, base_dir)
    elif cfg.synthetic is not None:
        from traces.synth import synthesize_from

        loads.append((synthesize_from(cfg.synthetic, base_dir), 0.0))
    elif not cfg.merge:
        main = DEFAULT_TRACE
    if main is not None:
        loads.append((load_trace(
            main, format=format_override or cfg.format, column_map=cfg.column_map,
            time_unit=cfg.time_unit, workload=cfg.workload,
            prefix_block_tokens=cfg.prefix_block_tokens, strict=strict, limits=limits, stream=stream,
        ), 0.0))  # fmt: skip
    for extra in cfg.merge:
        loaded = load_trace(
            _resolve(extra.path, base_dir), format=extra.format, column_map=extra.column_map,
            time_unit=extra.time_unit, workload=extra.workload,
            prefix_block_tokens=extra.prefix_block_tokens, strict=strict, limits=limits,
        )  # fmt: skip
        loads.append((_transformed(loaded, extra), extra.offset_s))
    trace = loads[0][0] if len(loads) == 1 else _merged(loads)
    if trace.stream is None:  # (a trace read in batches has nothing to transform)
        trace = _transformed(trace, cfg, base_dir)
    _check_final_span(trace, limits.max_span_s)
    return trace


def reads_as_is(cfg: TraceConfig | None) -> bool:
    """Whether the trace section replays one file's rows as they are: no merge, and none of
    `_transformed`'s steps (what a trace read in batches needs)."""
    if cfg is None:
        return True
    return not cfg.merge and cfg.synthetic is None and all(
        value is None for value in (cfg.filter, cfg.window, cfg.whatif, cfg.rate_scale, cfg.sample))


def _check_labels_present(frame, flt: FilterConfig, source: str) -> None:
    """A filter label that matches no row is a typo, not a wish for fewer requests."""
    for column, wanted, flag in (("workload", flt.workloads, "--only-workload"), ("tenant", flt.tenants, None)):
        if not wanted:
            continue
        counts = dict(frame.group_by(column).len().sort(column).iter_rows())
        missing = [label for label in wanted if label not in counts]
        if missing:
            present = ", ".join(f"{label!r} ({n:,})" for label, n in counts.items())
            where = f"{flag} / trace.filter.{column}s" if flag else f"trace.filter.{column}s"
            raise TraceError(f"{source}: {where}: {column} {missing[0]!r} matches no request; the trace's "
                             f"{column}s: {present}")


def _check_final_span(trace: LoadedTrace, max_span_s: float) -> None:
    """Each file's span was checked as it was read; offsets and rate scaling can still stretch it."""
    arrival = trace.frame["arrival_us"] if trace.stream is None else trace.stream.ends()["arrival_us"]
    span_s = (int(arrival[-1]) - int(arrival[0])) / 1e6
    if span_s > max_span_s:
        raise TraceError(
            f"{trace.source}: after merge offsets and rate_scale the trace spans {human_span(span_s)}, more than "
            f"the bound of {human_span(max_span_s)} (--max-span-s raises it)"
        )


def _merged(loads: list[tuple[LoadedTrace, float]]) -> LoadedTrace:
    traces = [t for t, _ in loads]
    blocks = {t.prefix_block_tokens for t in traces if t.prefix_block_tokens is not None}
    if len(blocks) > 1:
        raise TraceError(
            "cannot merge traces with different prefix block sizes: "
            + ", ".join(f"{t.source} ({t.prefix_block_tokens} tokens)" for t in traces
                        if t.prefix_block_tokens)
        )
    dropped: dict[str, int] = {}
    for t in traces:
        for reason, count in t.dropped.items():
            dropped[reason] = dropped.get(reason, 0) + count
    frame = merge([t.frame for t in traces], [round(off * 1e6) for _, off in loads])
    return LoadedTrace(
        frame=frame,
        source=" + ".join(t.source for t in traces),
        format="merged",
        prefix_block_tokens=blocks.pop() if blocks else None,
        sha256=hashlib.sha256("".join(t.sha256 for t in traces).encode()).hexdigest(),
        dropped=dropped,
        reordered=sum(t.reordered for t in traces),
        notes=tuple(n for t in traces for n in t.notes) + _shared_hash_notes(traces),
    )


def _shared_hash_notes(traces: list[LoadedTrace]) -> tuple[str, ...]:
    """Prefix-block hash ids are local to the trace that numbered them: two sources sharing ids
    (one trace merged with itself, or two numbered from 0) replay as sharing prompt prefixes."""
    ids = [t.frame["prefix_hashes"].explode().drop_nulls().unique().to_numpy() for t in traces]
    notes = []
    for i in range(len(traces)):
        for j in range(i + 1, len(traces)):
            if not len(ids[i]) or not len(ids[j]):
                continue
            shared = len(np.intersect1d(ids[i], ids[j], assume_unique=True))
            if shared:
                same = " (the same file twice)" if traces[i].sha256 == traces[j].sha256 else ""
                notes.append(
                    f"{traces[i].source} and {traces[j].source}{same} share {shared:,} prefix-block hash ids: "
                    "their requests will be replayed as sharing prompt prefixes, so prefix reuse and cache "
                    "hits will be inflated"
                )
    return tuple(notes)


def _with_whatif(trace: LoadedTrace, whatif: WhatIfConfig, base_dir) -> LoadedTrace:
    """The what-ifs, then the added tenant merged in (its hashes checked against the trace's)."""
    if trace.frame.height == 0:
        raise TraceError(f"{trace.source}: no requests left for trace.whatif after the filter/window")
    trace = apply_whatif(trace, whatif, base_dir)
    if whatif.add_tenant is None:
        return trace
    from traces.synth import synthesize

    spec, folder, name = tenant_spec(whatif, trace, base_dir)
    return _merged([(trace, 0.0), (synthesize(spec, folder, name), 0.0)])


def _transformed(trace: LoadedTrace, cfg: TraceConfig | MergeSource, base_dir=None) -> LoadedTrace:
    frame = trace.frame
    dropped = dict(trace.dropped)

    def step(reason: str, new):
        nonlocal frame
        dropped[reason] = dropped.get(reason, 0) + frame.height - new.height
        frame = new

    if getattr(cfg, "filter", None) is not None:
        _check_labels_present(frame, cfg.filter, trace.source)
        step("filtered", filter_rows(frame, cfg.filter))
    if cfg.window is not None:
        step("outside_window", window(frame, cfg.window.start_s, cfg.window.end_s))
    whatif = getattr(cfg, "whatif", None)
    if whatif is not None:
        trace = _with_whatif(dataclasses.replace(trace, frame=frame), whatif, base_dir)
        frame = trace.frame
    if cfg.rate_scale is not None:
        frame = scale_rate(frame, cfg.rate_scale)
    if cfg.sample is not None:
        if frame.height == 0:
            raise TraceError(f"{trace.source}: no requests left to sample after filter/window")
        step("sampled_out", sample(frame, cfg.sample.fraction, cfg.sample.n, cfg.sample.seed))
    if frame.height == 0:
        raise TraceError(f"{trace.source}: no requests left after the trace filter/window")
    return dataclasses.replace(trace, frame=frame, dropped=dropped)
