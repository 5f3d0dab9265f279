"""`fixed`: keep the pool at a configured count, or at whatever it is asked to have now.

No upstream: a static Deployment `replicas:` field. The baseline every autoscaler is compared with.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.api import Decision, ScalingContext
from policies.autoscalers._util import check_int, check_number


@dataclass(frozen=True)
class FixedParams:
    replicas: int | None = None  # None: keep ctx.desired
    decision_interval_s: float = 0.0

    def __post_init__(self) -> None:
        if self.replicas is not None:
            check_int("replicas", self.replicas, lo=0)
        check_number("decision_interval_s", self.decision_interval_s, lo=0)


@dataclass(frozen=True)
class FixedState:
    """No state; the type exists so every autoscaler has one."""


def fixed_state(params: FixedParams) -> FixedState:
    return FixedState()


def fixed(ctx: ScalingContext, params: FixedParams, state: FixedState) -> Decision[FixedState]:
    n = ctx.desired if params.replicas is None else params.replicas
    return Decision(n, state, {"replicas": n})
