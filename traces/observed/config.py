"""The `observed:` config section: which labels name the pool and the replica, which label
values are which pool, how trace time maps to wall time, and the PromQL windows.

Defaults follow the exporters' own labels: vLLM labels its series `model_name` and `engine`
(vllm/v1/metrics/loggers.py), Prometheus' Kubernetes discovery commonly adds `pod` and
`namespace`, kube-state-metrics labels a Deployment's series `deployment` and `namespace`, and
dcgm-exporter labels a GPU `gpu`, `UUID`, `Hostname` (plus `pod`/`namespace` with its Kubernetes
mapping on); llm-replay's own export writes `pool` and `replica`. So a series' pool is taken
from the first of `pool`, `deployment`, `pod` (the Deployment its name was made from) and
`model_name` whose value is a pool, directly or through `pools`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from common.configtools import from_dict

DEFAULT_POOL_LABELS = ("pool", "deployment", "pod", "model_name")
DEFAULT_REPLICA_LABELS = ("replica", "pod", "instance")
# Prometheus' default lookback delta (--query.lookback-delta, 5m): an instant vector takes the
# latest sample no older than this.
DEFAULT_LOOKBACK_S = 300.0


@dataclasses.dataclass(frozen=True)
class ObservedConfig:
    """`pool_label` / `replica_label`: a label name or a list tried in order; `pools`: label value
    (a Deployment, a model name, a host) -> pool name, for values that are not pool names
    themselves; `offset_s`: the wall time (Unix seconds) of trace time 0, or null to use the
    trace's own timestamps; `lookback_s`: how old a gauge's latest sample may be at a tick;
    `rate_window_s`: the range of rate(...[w]) for counters and histogram buckets;
    `window_s`: the windows divergence is measured over."""

    pool_label: str | tuple[str, ...] = DEFAULT_POOL_LABELS
    replica_label: str | tuple[str, ...] = DEFAULT_REPLICA_LABELS
    pools: dict[str, str] = dataclasses.field(default_factory=dict)
    offset_s: float | None = None
    lookback_s: float = DEFAULT_LOOKBACK_S
    rate_window_s: float = 60.0
    window_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("pool_label", "replica_label"):
            value = getattr(self, name)
            labels = (value,) if isinstance(value, str) else tuple(value)
            if not labels or not all(isinstance(x, str) and x for x in labels):
                raise ValueError(f"{name}: got {value!r}, expected a label name or a list of them")
            object.__setattr__(self, name, labels)
        for key, pool in self.pools.items():
            if not key or not isinstance(pool, str) or not pool:
                raise ValueError(f"pools.{key}: got {pool!r}, expected a pool name")
        for name in ("lookback_s", "rate_window_s", "window_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: got {getattr(self, name)!r}, expected seconds > 0")

    @classmethod
    def from_mapping(cls, value: Any, where: str = "observed", source: str = "config") -> "ObservedConfig":
        """The section from YAML-loaded `value`; errors name `source` and the key under `where`."""
        return from_dict(cls, value, where, source)
