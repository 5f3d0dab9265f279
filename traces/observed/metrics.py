"""The metrics the tool knows, by the names their exporters give them, and what each becomes.

vLLM's names, types and labels (`model_name`, `engine`) are those registered in
`PrometheusStatLogger.__init__` of vllm/v1/metrics/loggers.py (v0.10-v0.15): gauges
`vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` (0-1; the
older `vllm:gpu_cache_usage_perc`, deprecated in 0.9, carries the same value), counters
`vllm:num_preemptions`, `vllm:prompt_tokens`, `vllm:generation_tokens`, `vllm:request_success`
(per `finished_reason`), exposed with the `_total` suffix, histograms
`vllm:time_to_first_token_seconds`, `vllm:inter_token_latency_seconds` (and the deprecated
`vllm:time_per_output_token_seconds` observing the same intervals), `vllm:e2e_request_latency_seconds`,
and the info gauge `vllm:cache_config_info` (`log_metrics_info`) whose labels are the cache
config, `num_gpu_blocks` among them. `DCGM_FI_DEV_GPU_UTIL` is dcgm-exporter's GPU utilisation
in percent; `kube_deployment_status_replicas` is kube-state-metrics' replica count of a
Deployment: its `status.replicas` (kube-state-metrics internal/store/deployment.go), "total
number of non-terminated pods targeted by this deployment" (the apps/v1 DeploymentStatus API
reference), ready or not: starting pods count, terminating (draining) ones do not.

A signal is what is compared with a replayed column; `replayed` names that column of
ticks.parquet (or what it is derived from) for the code that wires the two together.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

Kind = Literal["gauge", "counter", "histogram", "info"]


@dataclasses.dataclass(frozen=True)
class Metric:
    name: str          # the sample name as Prometheus stores it (counters with _total)
    signal: str        # what it becomes after alignment (a histogram's: signal_p50, ...)
    kind: Kind
    combine: Literal["sum", "mean"]  # across the series of one pool (or one replica)
    replayed: str      # the ticks.parquet column it compares with
    scale: float = 1.0  # observed value x scale = the signal's unit
    rank: int = 0      # of two names for one signal (a rename), the lower rank is used
    per_replica: bool = True  # False: a pool-level series, whatever labels its exporter adds


KNOWN: dict[str, Metric] = {m.name: m for m in (
    Metric("vllm:num_requests_waiting", "waiting", "gauge", "sum", "waiting"),
    Metric("vllm:num_requests_running", "running", "gauge", "sum", "running"),
    Metric("vllm:kv_cache_usage_perc", "kv_usage", "gauge", "mean", "kv_usage"),
    Metric("vllm:gpu_cache_usage_perc", "kv_usage", "gauge", "mean", "kv_usage", rank=1),
    Metric("DCGM_FI_DEV_GPU_UTIL", "gpu_busy", "gauge", "mean", "gpu_busy", scale=0.01),
    Metric("kube_deployment_status_replicas", "replicas", "gauge", "sum",
           "replicas_active + replicas_loading", per_replica=False),
    Metric("vllm:num_preemptions_total", "preemptions_per_s", "counter", "sum", "preemptions / tick_s"),
    Metric("vllm:prompt_tokens_total", "prompt_tokens_per_s", "counter", "sum", "prompt_tokens_per_s"),
    Metric("vllm:generation_tokens_total", "output_tokens_per_s", "counter", "sum", "output_tokens_per_s"),
    Metric("vllm:request_success_total", "finished_per_s", "counter", "sum", "finished / tick_s"),
    Metric("vllm:time_to_first_token_seconds", "ttft_s", "histogram", "sum", "requests: first_token_us - arrival_us"),
    Metric("vllm:inter_token_latency_seconds", "itl_s", "histogram", "sum", "requests: decode time per output token"),
    Metric("vllm:time_per_output_token_seconds", "itl_s", "histogram", "sum",
           "requests: decode time per output token", rank=1),
    Metric("vllm:e2e_request_latency_seconds", "e2e_s", "histogram", "sum", "requests: finished_us - arrival_us"),
    Metric("vllm:cache_config_info", "num_gpu_blocks", "info", "sum", "kv_total_blocks per replica"),
)}

# Series of a known histogram other than its buckets: read, not used, not "unknown".
HISTOGRAM_PARTS = ("_bucket", "_count", "_sum", "_created")
# The quantiles a histogram becomes, as histogram_quantile(q, ...) would give them.
QUANTILES: tuple[tuple[str, float], ...] = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


def lookup(name: str) -> tuple[Metric | None, bool]:
    """(the known metric `name` is a series of, whether its samples are used): a histogram's
    `_bucket` series are used, its `_count`, `_sum` and `_created` are known but unused, as are
    a counter's `_created`; (None, False) for a name the tool does not know."""
    if name in KNOWN:
        metric = KNOWN[name]
        return metric, metric.kind != "histogram"
    for suffix in HISTOGRAM_PARTS:
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            metric = KNOWN.get(base)
            if metric is not None and metric.kind == "histogram":
                return metric, suffix == "_bucket"
    if name.endswith("_created"):
        metric = KNOWN.get(name[: -len("_created")] + "_total")
        if metric is not None and metric.kind == "counter":
            return metric, False
    return None, False


def signals() -> list[str]:
    """Every signal alignment can produce, histograms as their quantiles."""
    out: list[str] = []
    for metric in KNOWN.values():
        names = [f"{metric.signal}_{q}" for q, _ in QUANTILES] if metric.kind == "histogram" else [metric.signal]
        out += [n for n in names if n not in out and metric.kind != "info"]
    return out
