"""Trace options shared by `run` and `trace inspect`: the CLI face of the `trace:` config section.

Each flag overrides the same key of the config's `trace:` section (see traces/README.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

from common.errors import UserError
from traces import BUNDLED, DEFAULT_TRACE, FORMATS, FilterConfig, MergeSource, SampleConfig, TraceConfig, WindowConfig
from traces.transforms import RATE_SCALE_RANGE
from traces.limits import (
    BYTES_CEILING, DEFAULT_LIMITS, DEFAULT_MAX_BYTES, DEFAULT_MAX_LINE_BYTES, DEFAULT_MAX_ROWS, DEFAULT_MAX_SPAN_S,
    TraceLimits, human_bytes,
)  # fmt: skip


def add_trace_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("trace transforms (override the config's trace: section)")
    g.add_argument("--format", help="force the trace format instead of detecting it")
    g.add_argument("--column-map", metavar="NAME=COLUMN,...",
                   help="generic csv/jsonl/parquet: canonical name = source column, e.g. "
                        "arrival=ts,prompt_tokens=in,output_tokens=out")
    g.add_argument("--time-unit", choices=("s", "ms", "us", "datetime"), help="unit of the arrival column")
    g.add_argument("--strict", action="store_true", help="treat unsorted arrivals as an error")
    g.add_argument("--workload", metavar="LABEL", help="workload label for every row of the trace")
    g.add_argument("--merge", action="append", default=[], metavar="PATH[=LABEL]",
                   help="merge another trace (labelled LABEL); repeatable")
    g.add_argument("--window", metavar="START:END", help="keep arrivals in [START, END) seconds; either may be empty (a value starting with '-' "
                        "is joined by '=': --window=-5:)")
    g.add_argument("--rate-scale", type=float, metavar="X", help="multiply the request rate by X (compress time)")
    g.add_argument("--sample", metavar="N|FRACTION",
                   help="keep N requests, or a FRACTION (0, 1] of them (of a session trace: whole sessions)")
    g.add_argument("--seed", type=int, help="seed of --sample, or of the config's trace: sample (default: "
                                             "the config's seed, else 0)")
    g.add_argument("--only-workload", action="append", default=[], metavar="LABEL",
                   help="keep only rows of this workload; repeatable")
    g.add_argument("--max-prompt-tokens", type=int, metavar="N", help="drop rows with longer prompts")
    b = p.add_argument_group("trace bounds (refuse a trace that would exhaust the machine)")
    b.add_argument("--max-trace-bytes", type=size_bytes, metavar="BYTES",
                   help=f"most bytes one trace file may hold once decompressed, e.g. 3GiB "
                        f"(default {human_bytes(DEFAULT_MAX_BYTES)}; at most {BYTES_CEILING}, 4 GiB less one byte)")
    b.add_argument("--max-line-bytes", type=size_bytes, metavar="BYTES",
                   help=f"longest line a text trace may hold, e.g. 16MiB (default {human_bytes(DEFAULT_MAX_LINE_BYTES)}; "
                        "a trace row is well under 1 KiB)")
    b.add_argument("--max-rows", type=int, metavar="N",
                   help=f"most lines (Parquet: rows) one trace file may hold (default {DEFAULT_MAX_ROWS:,})")
    b.add_argument("--max-span-s", type=float, metavar="S",
                   help=f"longest span of arrivals a trace may have, in seconds (default {DEFAULT_MAX_SPAN_S:,.0f}: "
                        "31 days); a longer one usually means a wrong time unit or a stray timestamp")


def trace_limits(args: argparse.Namespace) -> TraceLimits:
    """The trace bounds the flags ask for (the defaults for those not given)."""
    changes = {name: getattr(args, name) for name in ("max_trace_bytes", "max_rows", "max_span_s", "max_line_bytes")
               if getattr(args, name, None) is not None}
    if "max_trace_bytes" in changes:
        changes["max_bytes"] = changes.pop("max_trace_bytes")
    try:
        return dataclasses.replace(DEFAULT_LIMITS, **changes)
    except ValueError as exc:
        raise UserError(str(exc)) from None


_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def size_bytes(text: str) -> int:
    """'3GiB', '500MB', '1000000' -> bytes."""
    number = text.strip().lower().rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text.strip().lower()[len(number):]
    try:
        value = float(number) * _UNITS[unit]
    except (KeyError, ValueError):
        value = math.nan
    if not 1 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"expected a size in bytes like 3GiB, 500MB or 1000000, got {text!r}")
    return int(value)


def effective_trace(
    base: TraceConfig | None, args: argparse.Namespace, base_dir: Path | None, absolute: bool = False,
) -> TraceConfig:
    """The trace a run replays: the config's trace: section with every CLI override applied, and
    paths made relative to the working directory (config paths are relative to the config file).
    With `absolute`, every path is absolute (bundled names stay names): that is what a run's
    config.yaml records, so it replays the same trace from anywhere."""
    cfg = apply_trace_options(base or TraceConfig(), args)
    changes: dict = {}
    trace_arg = getattr(args, "trace", None)
    if args.format and args.format not in FORMATS:
        raise UserError(f"{trace_arg or cfg.path or DEFAULT_TRACE}: --format {args.format!r} is not a known format; "
                        f"known: {', '.join(FORMATS)}")
    if trace_arg is not None:  # the command line's trace replaces the config's, synthetic or not
        changes["path"] = _absolute(trace_arg, Path.cwd()) if absolute else trace_arg
        changes["synthetic"] = None
    elif cfg.path is not None:
        changes["path"] = _absolute(cfg.path, base_dir)
    elif isinstance(cfg.synthetic, str):
        changes["synthetic"] = _absolute(cfg.synthetic, base_dir)
    elif isinstance(cfg.synthetic, dict):  # an inline spec: the files it names
        from traces.synth.spec import with_absolute_paths

        changes["synthetic"] = with_absolute_paths(cfg.synthetic, lambda path: _absolute(path, base_dir))
    elif cfg.synthetic is None and not cfg.merge:
        changes["path"] = DEFAULT_TRACE
    if args.format:
        changes["format"] = args.format
    if cfg.whatif is not None and isinstance(cfg.whatif.add_tenant, str):
        changes["whatif"] = dataclasses.replace(cfg.whatif, add_tenant=_absolute(cfg.whatif.add_tenant, base_dir))
    try:
        if cfg.merge:
            changes["merge"] = tuple(dataclasses.replace(m, path=_absolute(m.path, base_dir)) for m in cfg.merge)
        return dataclasses.replace(cfg, **changes)
    except ValueError as exc:
        raise UserError(f"trace options: {exc}") from None


def _absolute(path: str, base_dir: Path | None) -> str:
    if path in BUNDLED or Path(path).expanduser().is_absolute():
        return path
    return str(((base_dir or Path.cwd()) / Path(path).expanduser()).resolve())


def apply_trace_options(base: TraceConfig, args: argparse.Namespace) -> TraceConfig:
    """`base` with every trace flag that was given; bad values are UserErrors naming the flag."""
    changes: dict = {}
    try:
        if args.column_map:
            changes["column_map"] = _column_map(args.column_map)
        if args.time_unit:
            changes["time_unit"] = args.time_unit
        if args.workload is not None:
            if not args.workload.strip():
                raise ValueError(f"--workload {args.workload!r}: empty label (expected a name, or leave the flag out)")
            changes["workload"] = args.workload
        if args.merge:
            changes["merge"] = base.merge + tuple(_merge_source(m) for m in args.merge)
        if args.window:
            changes["window"] = _window(args.window)
        if args.rate_scale is not None:
            low, high = RATE_SCALE_RANGE
            if not (math.isfinite(args.rate_scale) and low <= args.rate_scale <= high):
                raise UserError(f"--rate-scale {args.rate_scale:g}: expected a number in [{low:g}, {high:g}] "
                                "(X times the trace's request rate)")
            changes["rate_scale"] = args.rate_scale
        if args.seed is not None:
            _check_seed(args.seed, seeds_something=bool(args.sample or base.sample))
        if args.sample:
            changes["sample"] = _sample(args.sample, 0 if args.seed is None else args.seed)
        elif args.seed is not None:  # the config's sample, seeded from the command line
            changes["sample"] = dataclasses.replace(base.sample, seed=args.seed)
        if args.only_workload or args.max_prompt_tokens is not None:
            old = base.filter or FilterConfig()
            changes["filter"] = dataclasses.replace(
                old,
                workloads=tuple(args.only_workload) or old.workloads,
                max_prompt_tokens=args.max_prompt_tokens if args.max_prompt_tokens is not None else old.max_prompt_tokens,
            )
        return dataclasses.replace(base, **changes)
    except (ValueError, TypeError) as exc:
        raise UserError(f"trace options: {exc}") from None


def _column_map(text: str) -> dict[str, str]:
    mapping = {}
    for item in text.split(","):
        name, sep, column = item.partition("=")
        if not sep or not name.strip() or not column.strip():
            raise ValueError(f"--column-map {text!r}: expected NAME=COLUMN pairs separated by commas, "
                             "e.g. arrival=ts,prompt_tokens=in,output_tokens=out")
        mapping[name.strip()] = column.strip()
    return mapping


def _merge_source(text: str) -> MergeSource:
    path, sep, label = text.partition("=")
    if not path:
        raise ValueError(f"--merge {text!r}: expected PATH or PATH=LABEL")
    if sep and not label.strip():
        raise ValueError(f"--merge {text!r}: empty LABEL after '=' (expected PATH=LABEL, or PATH alone)")
    return MergeSource(path=path, workload=label or None)


def _window(text: str) -> WindowConfig:
    start, sep, end = text.partition(":")
    if not sep:
        raise ValueError(f"--window {text!r}: expected START:END in seconds, e.g. 600:1800 or :300")
    try:
        return WindowConfig(start_s=float(start) if start else 0.0, end_s=float(end) if end else None)
    except ValueError as exc:
        raise ValueError(f"--window {text!r}: {exc}") from None


def _check_seed(seed: int, seeds_something: bool) -> None:
    """--seed is within a seed's bounds, and seeds something: a flag that changes nothing is an error."""
    from common.bounds import out_of_bounds

    problem = out_of_bounds(None, "seed", seed)
    if problem is not None:
        raise UserError(f"--seed {seed}: expected {problem}")
    if not seeds_something:
        raise UserError("--seed only seeds --sample; give --sample N or drop --seed")


def _sample(text: str, seed: int) -> SampleConfig:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"--sample {text!r}: expected a count (e.g. 1000) or a fraction (e.g. 0.1)") from None
    if value.is_integer() and value >= 1 and "." not in text:
        return SampleConfig(n=int(value), seed=seed)
    return SampleConfig(fraction=value, seed=seed)
