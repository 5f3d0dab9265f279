"""One name in one place: every policy's name, its numba dispatch id and its upstream source.

The numba engine dispatches per-arrival and per-step policies by integer id
(`replay/engine_nb.py`: `route`); a test walks this registry to check each id has a branch.
"""

from __future__ import annotations

from dataclasses import dataclass

from traces.errors import ConfigError


@dataclass(frozen=True)
class PolicySpec:
    family: str
    name: str
    numba_id: int
    summary: str
    source: str


ROUTERS: dict[str, PolicySpec] = {
    spec.name: spec
    for spec in (
        PolicySpec(
            "router", "least-outstanding", 0,
            "the replica with the fewest waiting + running requests (lowest index on ties)",
            "Envoy / Kubernetes gateway least-request load balancing",
        ),
        PolicySpec(
            "router", "round-robin", 1,
            "replicas in turn, one counter per pool",
            "vLLM production-stack router default (roundrobin)",
        ),
    )
}


def router_id(name: str) -> int:
    try:
        return ROUTERS[name].numba_id
    except KeyError:
        raise ConfigError(f"unknown router {name!r}; known: {', '.join(sorted(ROUTERS))}") from None
