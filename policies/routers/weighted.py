"""weighted: the replica with the highest weighted sum of scorers, as llm-d composes its scheduler.

Upstream: llm-d's inference scheduler (the Gateway API inference extension's EPP) runs a
scheduling profile of scorer plugins, each giving every candidate pod a score, and picks the
pod with the highest weighted sum (pkg/epp/scheduling/framework: weighted scorers, max-score
picker). The scorers here, each computed per active replica of the pool:

    prefix    leading prompt blocks in its prefix cache / prompt blocks, in [0, 1]
              (llm-d prefix-cache scorer)
    queue     (max waiting - its waiting) / (max - min) over the pool, 1 when all are equal
              (llm-d queue scorer: min-max normalised queue depth)
    kv_free   1 - KV blocks used / KV blocks (llm-d kv-cache-utilization scorer)
    kv_use    - KV blocks used / KV blocks (the same signal, not offset: least-kv)
    running   - running requests
    vllm_dp   - (waiting * 4 + running) (vLLM's data-parallel balancer,
              vllm/v1/engine/core_client.py DPLBAsyncMPClient.get_core_engine_for_request)
    kv_cost   - (prompt blocks not in its cache + KV blocks it holds) (NVIDIA Dynamo's KV
              router cost with overlap_score_weight 1 and temperature 0)

All but `prefix` read the scraped view (router_refresh_ms stale). The sum is taken in the
order above and a scorer of weight 0 is skipped, so a preset of one scorer with weight 1 is
bit-for-bit that scorer. The lowest index wins ties. Presets: prefix-aware, least-kv,
vllm-dp and kv-cost (SPECS).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from numba import njit

from policies.routers._view import R_ACTIVE, RouterView, active_replicas

SCORERS = ("prefix", "queue", "kv_free", "kv_use", "running", "vllm_dp", "kv_cost")
S_PREFIX, S_QUEUE, S_KV_FREE, S_KV_USE, S_RUNNING, S_VLLM_DP, S_KV_COST = range(len(SCORERS))
READS_VIEW = True


@dataclass(frozen=True)
class WeightedParams:
    # llm-d's weights for prefix-aware routing (prefix 2, queue 1, KV utilisation 1).
    scorers: dict[str, float] = field(default_factory=lambda: {"prefix": 2.0, "queue": 1.0, "kv_free": 1.0})

    def __post_init__(self) -> None:
        if not isinstance(self.scorers, dict):
            raise ValueError(f"scorers: got {self.scorers!r}, expected a mapping of scorer name to weight")
        for name, weight in self.scorers.items():
            if name not in SCORERS:
                from common.configtools import suggest

                raise ValueError(f"scorers: unknown scorer {name!r}{suggest(name, SCORERS)}; known: "
                                 f"{', '.join(SCORERS)}")
            if not (isinstance(weight, (int, float)) and not isinstance(weight, bool) and 0 <= weight < 1e6):
                raise ValueError(f"scorers.{name}: got {weight!r}, expected a weight >= 0")
        if not any(self.scorers.values()):
            raise ValueError("scorers: expected at least one scorer with a weight > 0")
        object.__setattr__(self, "scorers", {name: float(w) for name, w in self.scorers.items()})

    def row(self) -> tuple[float, ...]:
        return tuple(float(self.scorers.get(name, 0.0)) for name in SCORERS)


Params = WeightedParams
SPECS = (
    ("weighted", Params(), "max of the weighted sum of scorers (router.scorers: prefix, queue, kv_free, kv_use, "
     "running, vllm_dp, kv_cost)", "llm-d inference scheduler: weighted scorer plugins, max-score picker"),
    ("prefix-aware", Params({"prefix": 2, "queue": 1, "kv_free": 1}),
     "max of 2 x prefix-cache match + 1 x queue score + 1 x free KV, each in [0, 1]",
     "llm-d inference scheduler (pkg/epp/.../scorer: prefix, queue, kv-cache-utilization)"),
    ("least-kv", Params({"kv_use": 1}), "lowest KV-cache use, as last scraped",
     "llm-d kv-cache-utilization scorer used alone"),
    ("vllm-dp", Params({"vllm_dp": 1}), "lowest waiting * 4 + running, as last scraped",
     "vLLM data-parallel load balancer (vllm/v1/engine/core_client.py, DPLBAsyncMPClient)"),
    ("kv-cost", Params({"kv_cost": 1}),
     "min of prompt blocks left after the cached overlap + KV blocks the replica holds",
     "NVIDIA Dynamo KV router (overlap_score_weight 1, temperature 0)"),
)


def reads_prefix(prm) -> bool:
    """The engine finds each active replica's prefix-cache hits only for a router that reads them."""
    return bool(prm[S_PREFIX] != 0.0 or prm[S_KV_COST] != 0.0)


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def kernel(v, p, first, n, active, need, w):
    max_wait = 0
    min_wait = -1
    if w[S_QUEUE] != 0.0:
        for r in range(first, first + n):
            if v.state[r] == R_ACTIVE:
                max_wait = max(max_wait, v.wait[r])
                min_wait = v.wait[r] if min_wait < 0 else min(min_wait, v.wait[r])
    best = -1
    best_score = 0.0
    for r in range(first, first + n):
        if v.state[r] != R_ACTIVE:
            continue
        score = 0.0
        if w[S_PREFIX] != 0.0:
            score += w[S_PREFIX] * (v.hits[r] / max(need, 1))
        if w[S_QUEUE] != 0.0:
            score += w[S_QUEUE] * (1.0 if max_wait == min_wait else (max_wait - v.wait[r]) / (max_wait - min_wait))
        if w[S_KV_FREE] != 0.0:
            score += w[S_KV_FREE] * (1.0 - v.kv[r] / max(v.blocks[r], 1))
        if w[S_KV_USE] != 0.0:
            score += w[S_KV_USE] * (-float(v.kv[r]) / max(v.blocks[r], 1))
        if w[S_RUNNING] != 0.0:
            score += w[S_RUNNING] * -float(v.run[r])
        if w[S_VLLM_DP] != 0.0:
            score += w[S_VLLM_DP] * -float(v.wait[r] * 4 + v.run[r])
        if w[S_KV_COST] != 0.0:
            score += w[S_KV_COST] * -float(need - v.hits[r] + v.kv[r])
        if best < 0 or score > best_score:
            best = r
            best_score = score
    return best


def reference(v: RouterView, p: int, first: int, n: int, active: int, need: int, w) -> int:
    candidates = active_replicas(v, first, n)
    waits = [v.wait[r] for r in candidates]
    hi, lo = max(waits), min(waits)
    scorers = {
        "prefix": lambda r: v.hits[r] / max(need, 1),
        "queue": lambda r: 1.0 if hi == lo else (hi - v.wait[r]) / (hi - lo),
        "kv_free": lambda r: 1.0 - v.kv[r] / max(v.blocks[r], 1),
        "kv_use": lambda r: -float(v.kv[r]) / max(v.blocks[r], 1),
        "running": lambda r: -float(v.run[r]),
        "vllm_dp": lambda r: -float(v.wait[r] * 4 + v.run[r]),
        "kv_cost": lambda r: -float(need - v.hits[r] + v.kv[r]),
    }
    used = [(float(weight), scorers[name]) for name, weight in zip(SCORERS, w) if weight != 0.0]

    def score(r: int) -> float:
        total = 0.0
        for weight, scorer in used:
            total += weight * scorer(r)
        return total

    return max(candidates, key=score)  # max() keeps the first (lowest index) of equals

