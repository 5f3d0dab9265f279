"""Multi-turn sessions (chat) and agentic chains as rows of a trace.

A session's context is one growing token stream: turn 1's prompt is the system prompt (if its
group has one) plus a question; turn k+1's is turn k's prompt plus turn k's answer plus a new
question, so P_{k+1} >= P_k + O_k. Each turn after the first records `think_time_us`, the delay
between the previous turn's finish and its release (a user's think time, an agent's tool time),
and a plausible open-loop arrival: the previous arrival + an estimated latency (ttft_s +
tpot_s x its output tokens) + the think time, so the trace replays open-loop as well. A turn that
would pass max_context_tokens or arrive after the spec's duration ends its session there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from traces.synth.spec import Sessions

MAX_TURNS = 10_000


@dataclass(frozen=True)
class SessionRows:
    arrival_us: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    session: np.ndarray  # the session's number within its workload
    think_us: np.ndarray  # -1 on a first turn (null in the trace)


def _segmented_cumsum(values: np.ndarray, first: np.ndarray, owner: np.ndarray) -> np.ndarray:
    total = np.cumsum(values)
    before = np.where(first > 0, total[np.maximum(first - 1, 0)], 0)
    return total - before[owner]


def session_rows(rng: np.random.Generator, starts: np.ndarray, samplers, s: Sessions, group: np.ndarray,
                 system_tokens: int, duration_s: float, max_rows: int) -> SessionRows:
    """The turns of sessions starting at `starts` (sorted seconds), in session-then-turn order.
    `samplers`: question tokens, output tokens, think seconds, turns per session."""
    question, output, think, turns = samplers
    count = np.minimum(turns(rng, len(starts), starts), MAX_TURNS)
    if int(count.sum()) > max_rows:
        from common.errors import ConfigError

        raise ConfigError(f"sessions: {int(count.sum()):,} turns, more than max_requests={max_rows:,}")
    owner = np.repeat(np.arange(len(starts)), count)
    first = np.concatenate(([0], np.cumsum(count)[:-1]))
    turn = np.arange(len(owner)) - first[owner]
    t0 = starts[owner]
    q = question(rng, len(owner), t0).astype(np.int64)  # contexts add up past int32
    o = output(rng, len(owner), t0).astype(np.int64)
    wait = think(rng, len(owner), t0)
    prev_out = np.concatenate(([0], o[:-1]))
    opening = np.where(group[owner] >= 0, system_tokens, 0)
    increment = q + np.where(turn == 0, opening, prev_out)
    prompt = _segmented_cumsum(increment, first, owner)
    # microseconds, whole: think time as recorded, latency as estimated for the open-loop arrival
    think_us = np.where(turn == 0, -1, np.rint(wait * 1e6)).astype(np.int64)
    latency_us = np.rint((s.ttft_s + s.tpot_s * prev_out) * 1e6).astype(np.int64)
    step = np.where(turn == 0, 0, latency_us + think_us)
    arrival_us = np.floor(t0 * 1e6).astype(np.int64) + _segmented_cumsum(step, first, owner)
    # a session ends at its first turn past the context limit or the duration (both only grow)
    past = (prompt > s.max_context_tokens) | (arrival_us >= round(duration_s * 1e6))
    keep = _segmented_cumsum(past.astype(np.int64), first, owner) == 0
    return SessionRows(arrival_us[keep], prompt[keep], o[keep], owner[keep], think_us[keep])
