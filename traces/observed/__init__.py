"""Observed serving metrics in: Prometheus range-query JSON, Prometheus/Grafana CSV and
OpenMetrics text read into polars frames, mapped to the fleet's pools, aligned on the replay's
tick grid as PromQL would evaluate them, and scored against the replayed series.

    observed = read_observed(paths)                 # Observed; .unknown lists unknown metrics
    mapped = select(observed, config, pools, window, trace_offset_s)
    aligned = align(mapped, Grid(start_s, tick_s, n), config)
    scores = score_all(aligned.values, replayed, grid, config.window_s)

or the first three at once: `observe(paths, config, pools, grid, trace_offset_s)`.
"""

from traces.observed.align import Aligned, Grid, align
from traces.observed.config import ObservedConfig
from traces.observed.divergence import Divergence, score, score_all, unmatched
from traces.observed.layout import Scrapes
from traces.observed.limits import DEFAULT_LIMITS, ObservedLimits
from traces.observed.mapping import Mapped, select
from traces.observed.metrics import KNOWN, QUANTILES, Metric, signals
from traces.observed.observe import Observation, observe
from traces.observed.read import FORMATS, detect, read_observed, read_one
from traces.observed.samples import Observed

__all__ = [
    "DEFAULT_LIMITS", "FORMATS", "KNOWN", "QUANTILES", "Aligned", "Divergence", "Grid", "Mapped", "Metric",
    "Observation", "Observed", "ObservedConfig", "ObservedLimits", "Scrapes", "align", "detect", "observe", "read_observed", "read_one", "score",
    "score_all", "select", "signals", "unmatched",
]
