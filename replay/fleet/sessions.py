"""Closed-loop replay of multi-turn sessions (`trace: {closed_loop: true}`): what the engines need
to release a session's next turn when the replay ends the previous one (engine/sessions.py).

A session is its rows with one `session_id`, in arrival order. Its first turn arrives at its
recorded time; turn k+1 is sent by its client `think` after the client saw turn k end, so it
reaches the engine at

    end(k) + token_return(k) + think(k+1) + api_server + tokenize(k+1)

(the serving terms of replay/model/serving.py). `think` is, in order of preference: the trace's
`think_time_us` of turn k+1 (a synthetic trace's, or an agent's tool time); the recorded gap
between the two arrivals minus turn k's recorded `observed_e2e_us` (a request log's), at least
0; else the recorded gap itself, which assumes turn k took no time (a note counts those turns).
A turn that is rejected ends at its rejection, and its session goes on: a chat client shows
the error and its user sends the next message (a retry would replay the same request again).

Prefix cache across turns: a session's context is one growing token stream, so turn k+1's
prefix hashes extend turn k's and cover turn k's answer. Turn k then hashes its prompt and its
answer with its successor's hashes (up to min(P_k + O_k, P_k+1) tokens), so the blocks it
generates are the blocks turn k+1's prompt looks up (kvblocks.block_key_nb).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import polars as pl

from common.errors import ConfigError
from replay.engine.common import PENDING
from replay.model.serving import ServingTerms, token_return_us
from traces import LoadedTrace


@dataclasses.dataclass(frozen=True)
class Sessions:
    """Per request: the session's next turn (-1: none), the think time before it (-1: a first
    turn or no session), and what the think time was taken from (THINK_*)."""

    next_turn: np.ndarray
    think_us: np.ndarray
    source: np.ndarray


THINK_NONE, THINK_TRACE, THINK_OBSERVED, THINK_GAP = 0, 1, 2, 3


def check_closed_loop(frame: pl.DataFrame, source: str) -> None:
    """A closed-loop replay needs sessions: a trace without any is a mistake, not an open loop."""
    if frame["session_id"].null_count() == frame.height:
        raise ConfigError(f"{source}: trace.closed_loop: true, but the trace has no session_id on any of its "
                          f"{frame.height:,} rows (expected a trace with sessions, e.g. BLIS TraceV2's session_id or "
                          "`llm-replay synth` sessions; or closed_loop: false)")


def find_sessions(frame: pl.DataFrame) -> Sessions:
    n = frame.height
    index = pl.int_range(n, dtype=pl.Int64, eager=True)
    turns = pl.DataFrame({"s": frame["session_id"], "i": index}).filter(pl.col("s").is_not_null())
    turns = turns.with_columns(nxt=pl.col("i").shift(-1).over("s"), prv=pl.col("i").shift(1).over("s"))
    next_turn = np.full(n, -1, np.int64)
    prev_turn = np.full(n, -1, np.int64)
    rows = turns["i"].to_numpy()
    next_turn[rows] = turns["nxt"].fill_null(-1).to_numpy()
    prev_turn[rows] = turns["prv"].fill_null(-1).to_numpy()
    later = np.nonzero(prev_turn >= 0)[0]
    prev = prev_turn[later]
    arrival = frame["arrival_us"].to_numpy().astype(np.int64)
    gap = arrival[later] - arrival[prev]
    think = gap.copy()
    source = np.full(len(later), THINK_GAP, np.int8)
    if "observed_e2e_us" in frame.columns:
        e2e = frame["observed_e2e_us"].to_numpy()[prev]
        known = ~np.isnan(e2e.astype(np.float64))
        think[known] = np.maximum(0, gap[known] - e2e[known].astype(np.int64))
        source[known] = THINK_OBSERVED
    if "think_time_us" in frame.columns:
        given = frame["think_time_us"].to_numpy()[later].astype(np.float64)
        known = ~np.isnan(given)  # never negative: traces/schema.py refuses that as the trace loads
        think[known] = given[known].astype(np.int64)
        source[known] = THINK_TRACE
    think_us = np.full(n, -1, np.int64)
    think_us[later] = think
    sources = np.full(n, THINK_NONE, np.int8)
    sources[later] = source
    return Sessions(next_turn, think_us, sources)


def session_notes(frame: pl.DataFrame, source: str) -> tuple[str, ...]:
    """The warning a closed-loop replay gives once: how many turns' think time it had to assume."""
    sessions = find_sessions(frame)
    assumed = int((sessions.source == THINK_GAP).sum())
    if not assumed:
        return ()
    later = int((sessions.source != THINK_NONE).sum())
    return (f"{source}: trace.closed_loop: {assumed:,} of {later:,} later turns have no recorded think time "
            "(no think_time_us, no observed_e2e_us of the turn before): their think time is the recorded gap "
            "between the two arrivals, as if the turn before took no time",)


def with_session_notes(trace: LoadedTrace, config_source: str) -> LoadedTrace:
    """Refuse a trace without sessions, and note the think times assumed (before any replay)."""
    check_closed_loop(trace.frame, config_source)
    return dataclasses.replace(trace, notes=trace.notes + session_notes(trace.frame, str(trace.source)))


def client_delay_us(prompt: np.ndarray, pool_index: np.ndarray, terms: Sequence[ServingTerms]) -> np.ndarray:
    """int64[N]: from a client's send to its engine's arrival (serving.engine_arrivals' delay)."""
    fixed = np.array([t.api_server_us for t in terms], np.float64)[pool_index]
    per_token = np.array([t.tokenize_us_per_token for t in terms], np.float64)[pool_index]
    return np.rint(fixed + per_token * prompt).astype(np.int64)


def closed_loop_inputs(frame: pl.DataFrame, pool_index: np.ndarray, terms: Sequence[ServingTerms],
                       hash_off: np.ndarray, hash_len: np.ndarray, flat: np.ndarray,
                       source: str = "config") -> dict[str, np.ndarray]:
    """EngineInputs' closed-loop columns, and each turn's hash slice (see the module's doc)."""
    check_closed_loop(frame, source)
    sessions = find_sessions(frame)
    prompt = frame["prompt_tokens"].to_numpy().astype(np.int64)
    output = frame["output_tokens"].to_numpy().astype(np.int64)
    later = sessions.think_us >= 0
    gap = np.full(frame.height, -1, np.int64)
    if later.any():
        prev = np.full(frame.height, -1, np.int64)
        prev[sessions.next_turn[sessions.next_turn >= 0]] = np.nonzero(sessions.next_turn >= 0)[0]
        lag = token_return_us(pool_index, terms)
        delay = client_delay_us(prompt, pool_index, terms)
        gap[later] = lag[prev[later]] + sessions.think_us[later] + delay[later]
    off, length, hashed = hash_off.copy(), hash_len.copy(), prompt.copy()
    for k in np.nonzero(sessions.next_turn >= 0)[0]:
        s = sessions.next_turn[k]
        own, nxt = int(hash_len[k]), int(hash_len[s])
        # The successor's hashes extend turn k's (its last block may have been partial): its
        # slice hashes turn k's context, answer included.
        if 0 < own <= nxt and prompt[s] >= prompt[k] and np.array_equal(
                flat[hash_off[k]:hash_off[k] + own - 1], flat[hash_off[s]:hash_off[s] + own - 1]):
            off[k], length[k] = hash_off[s], nxt
            hashed[k] = min(prompt[k] + output[k], prompt[s])
    return {"next_turn": sessions.next_turn, "turn_gap_us": gap, "hash_off": off, "hash_len": length,
            "hash_tokens": hashed}


def with_sent_times(columns: dict[str, np.ndarray], frame: pl.DataFrame, inputs, terms: Sequence[ServingTerms]):
    """The engine's request columns plus `sent_us`: when each request's client sent it, the
    recorded arrival for a first turn, the engine's release less the serving delay for a later one."""
    later = (inputs.turn_gap_us >= 0) & (columns["state"] != PENDING)  # a turn never released: as recorded
    delay = client_delay_us(inputs.prompt_tokens, inputs.pool, terms)
    sent = np.where(later, columns["arrival_us"] - delay, frame["arrival_us"].to_numpy())
    return {**columns, "sent_us": sent.astype(np.int64)}


def session_summary(frame: pl.DataFrame, requests: pl.DataFrame) -> dict[str, int]:
    """summary.json's `closed_loop`: sessions, their later turns, those whose think time was
    assumed, and the rejected turns whose session went on."""
    sessions = find_sessions(frame)
    has_next = sessions.next_turn >= 0
    rejected = (requests.sort("request_id")["status"] == "rejected").to_numpy()
    return {
        "sessions": int(frame["session_id"].drop_nulls().n_unique()),
        "later_turns": int((sessions.source != THINK_NONE).sum()),
        "think_time_assumed": int((sessions.source == THINK_GAP).sum()),
        "rejected_turns_continued": int((rejected & has_next).sum()),
    }
