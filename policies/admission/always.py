"""always: admit every request that fits the context (the engine's own checks still reject a
request longer than max_model_len or larger than a replica's KV cache).

Upstream: vLLM has no admission control of its own; a request is refused only when it cannot
fit (`max_model_len`), which the engine checks before any policy.
"""

from __future__ import annotations

from dataclasses import dataclass

from numba import njit

from policies.admission._view import AdmissionView

READS_POOL = False
REASON = ""
SPECS = (("always", "admit every request that fits the context", "vLLM (no admission control of its own)"),)


@dataclass(frozen=True)
class AlwaysParams:
    """Admit everything (vLLM itself never refuses a request that fits its context)."""

    def columns(self) -> dict[str, int]:
        return {}


Params = AlwaysParams


@njit(cache=True, _nrt=False, forceinline=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)
def kernel(v, p, r, q, t, a):
    return 0


def reference(v: AdmissionView, p: int, r: int, q: int, t: int, a) -> int:
    return 0
