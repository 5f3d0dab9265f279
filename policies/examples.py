"""User policies of every family, as a user writes them (the README's policy section shows them).

Load them with `--plugin policies.examples` and name them in a fleet config:

    pools:
      - name: chat
        router: "policies.examples:least_waiting_tokens"
        engine: {scheduling_policy: "policies.examples:shortest_job"}
        preemption: {victim: "policies.examples:fewest_blocks"}
        admission: {policy: "policies.examples:cap_long_prompts", params: {max_prompt_tokens: 8000}}

Each is a numba kernel with its family's signature (policies/user.py) and a plain-Python twin
for `--engine reference`; tests/differential/test_user_policies.py holds the two together and
tests/property/test_user_policies.py checks them against the engine's invariants with
`policies.testing`.
"""

from __future__ import annotations

from numba import njit

from policies.user import (
    ADMISSION_SIG, P_WAITING, Q_KV_BLOCKS, Q_OUTPUT_TOKENS, Q_PROMPT_TOKENS, QUEUE_SIG, R_LIVE_RUNNING,
    R_LIVE_WAITING, R_WAITING_TOKENS, ROUTER_SIG, VICTIM_SIG, admission, queue_order, router, victim,
)


def least_waiting_tokens_py(replicas, request, params, state):
    """The twin: the same choice in plain Python (numpy rows)."""
    state[0] += 1
    return min(range(replicas.shape[0]), key=lambda k: (replicas[k, R_WAITING_TOKENS], replicas[k, R_LIVE_RUNNING]))


@router(reference=least_waiting_tokens_py, state=1)
@njit(ROUTER_SIG, cache=True)
def least_waiting_tokens(replicas, request, params, state):
    """The replica with the fewest prompt tokens waiting, then the fewest running requests."""
    state[0] += 1  # requests routed (the state is the policy's own)
    best = 0
    for k in range(replicas.shape[0]):
        if (replicas[k, R_WAITING_TOKENS], replicas[k, R_LIVE_RUNNING]) < (
                replicas[best, R_WAITING_TOKENS], replicas[best, R_LIVE_RUNNING]):
            best = k
    return best


def least_outstanding_py(replicas, request, params, state):
    """The twin of `least_outstanding`."""
    load = replicas[:, R_LIVE_WAITING] + replicas[:, R_LIVE_RUNNING]
    return int(load.argmin())  # argmin keeps the first of equals


@router(reference=least_outstanding_py, state=0)
@njit(ROUTER_SIG, cache=True)
def least_outstanding(replicas, request, params, state):
    """The built-in least-outstanding router written as a user's (the benchmark compares them)."""
    best = 0
    for k in range(1, replicas.shape[0]):
        if (replicas[k, R_LIVE_WAITING] + replicas[k, R_LIVE_RUNNING]
                < replicas[best, R_LIVE_WAITING] + replicas[best, R_LIVE_RUNNING]):
            best = k
    return best


def shortest_job_py(request, params, state):
    return float(request[Q_PROMPT_TOKENS] + params[0] * request[Q_OUTPUT_TOKENS])


@queue_order(reference=shortest_job_py, params={"output_weight": 1.0})
@njit(QUEUE_SIG, cache=True)
def shortest_job(request, params, state):
    """Shortest job first: prompt tokens + output_weight x output tokens (an oracle bound)."""
    return float(request[Q_PROMPT_TOKENS] + params[0] * request[Q_OUTPUT_TOKENS])


def fewest_blocks_py(running, scheduled, params, state):
    best = running.shape[0] - 1
    for k in range(running.shape[0] - 1, scheduled - 1, -1):
        if running[k, Q_KV_BLOCKS] < running[best, Q_KV_BLOCKS]:
            best = k
    return best


@victim(reference=fewest_blocks_py)
@njit(VICTIM_SIG, cache=True)
def fewest_blocks(running, scheduled, params, state):
    """Of the requests not yet scheduled in this step, the one holding the fewest KV blocks (the
    latest admitted on ties): the cheapest to recompute."""
    best = running.shape[0] - 1
    for k in range(running.shape[0] - 1, scheduled - 1, -1):
        if running[k, Q_KV_BLOCKS] < running[best, Q_KV_BLOCKS]:
            best = k
    return best


def cap_long_prompts_py(pool, request, params, state):
    return int(pool[P_WAITING] >= params[1] and request[Q_PROMPT_TOKENS] > params[0])


@admission(reference=cap_long_prompts_py, params={"max_prompt_tokens": 8192.0, "max_waiting": 0.0})
@njit(ADMISSION_SIG, cache=True)
def cap_long_prompts(pool, request, params, state):
    """Reject prompts over max_prompt_tokens while the pool has max_waiting or more requests waiting."""
    if pool[P_WAITING] >= params[1] and request[Q_PROMPT_TOKENS] > params[0]:
        return 1
    return 0
