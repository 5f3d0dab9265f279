"""token-bucket: per tenant, a bucket refilled at a steady rate; a request costs its prompt +
output tokens and is rejected when the bucket cannot pay.

Upstream: API gateways' token-rate limits (OpenAI-style tokens-per-minute quotas; Envoy's
local rate limit is a token bucket of `max_tokens` refilled by `tokens_per_fill`). Levels are
in millionths of a token so that both engines refill in the same integer steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from numba import njit

from policies.admission._view import A_BUCKET, A_REFILL, AdmissionView

READS_POOL = True
REASON = "rate_limit"
SPECS = (("token-bucket", "per-tenant token bucket; a request costs prompt + output tokens",
          "API gateway token-rate limits (OpenAI-style TPM quotas)"),)


@dataclass(frozen=True)
class TokenBucketParams:
    """Per tenant: a bucket of `capacity_tokens` refilled at `refill_tokens_per_s`; a request
    costs its prompt + output tokens and is rejected when the bucket cannot pay."""

    capacity_tokens: int = 10_000
    refill_tokens_per_s: int = 1_000

    def __post_init__(self) -> None:
        if self.capacity_tokens <= 0:
            raise ValueError(f"capacity_tokens: got {self.capacity_tokens}, expected > 0")
        if self.refill_tokens_per_s < 0:
            raise ValueError(f"refill_tokens_per_s: got {self.refill_tokens_per_s}, expected >= 0")

    def columns(self) -> dict[str, int]:
        return {"bucket_tokens": self.capacity_tokens, "bucket_refill_per_s": self.refill_tokens_per_s}


Params = TokenBucketParams


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def kernel(v, p, r, q, t, a):
    k = p * v.tenants + v.tenant[q]
    full = a[A_BUCKET] * 1_000_000
    v.bucket[k] = min(full, v.bucket[k] + (t - v.bucket_at[k]) * a[A_REFILL])
    v.bucket_at[k] = t
    cost = (v.prompt[q] + v.output[q]) * 1_000_000
    if v.bucket[k] < cost:
        return 1
    v.bucket[k] -= cost
    return 0


def reference(v: AdmissionView, p: int, r: int, q: int, t: int, a) -> int:
    k = p * v.tenants + v.tenant[q]
    level = min(a[A_BUCKET] * 1_000_000, v.bucket[k] + (t - v.bucket_at[k]) * a[A_REFILL])
    cost = (v.prompt[q] + v.output[q]) * 1_000_000
    v.bucket_at[k] = t
    v.bucket[k] = level if level < cost else level - cost
    return int(level < cost)
