"""Request traces in: one canonical polars frame (`TRACE_SCHEMA`) from every supported source,
transforms over it, bundled sample traces, and summary statistics. Times are int64 microseconds.
"""

from traces.bundled import BUNDLED, DEFAULT_TRACE, bundled_trace_path
from traces.config import MergeSource, TraceConfig, load_from_config
from traces.inspect import inspect_trace
from traces.loader import LoadedTrace, load_trace
from traces.schema import TRACE_SCHEMA, cast_to_schema
from traces.source import FORMATS, detect_format
from traces.transforms import (
    FilterConfig, SampleConfig, WindowConfig, filter_rows, label, merge, sample, scale_rate, window,
)  # fmt: skip

__all__ = [
    "BUNDLED",
    "DEFAULT_TRACE",
    "FORMATS",
    "TRACE_SCHEMA",
    "FilterConfig",
    "LoadedTrace",
    "MergeSource",
    "SampleConfig",
    "TraceConfig",
    "WindowConfig",
    "bundled_trace_path",
    "cast_to_schema",
    "detect_format",
    "filter_rows",
    "inspect_trace",
    "label",
    "load_from_config",
    "load_trace",
    "merge",
    "sample",
    "scale_rate",
    "window",
]
