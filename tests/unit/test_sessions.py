"""Think times of closed-loop turns (replay/fleet/sessions.py): from the trace, a log, or assumed."""

from __future__ import annotations

import polars as pl
import pytest

from common.errors import ConfigError, TraceError
from replay.fleet.sessions import check_closed_loop, find_sessions, session_notes
from traces import cast_to_schema


def _frame(**extra):
    data = {"arrival_us": [0, 1_000, 5_000, 9_000], "prompt_tokens": [10, 20, 30, 40], "output_tokens": [1, 2, 3, 4],
            "session_id": ["a", None, "a", "a"], **extra}
    return cast_to_schema(pl.DataFrame(data))


def test_think_time_is_the_recorded_gap_when_nothing_else_is_known():
    sessions = find_sessions(_frame())
    assert sessions.next_turn.tolist() == [2, -1, 3, -1]
    assert sessions.think_us.tolist() == [-1, -1, 5_000, 4_000]
    (note,) = session_notes(_frame(), "t.csv")
    assert "2 of 2 later turns have no recorded think time" in note


def test_observed_e2e_is_taken_off_the_gap_and_think_time_us_wins():
    frame = _frame(observed_e2e_us=[4_000, None, 6_000, None])
    assert find_sessions(frame).think_us.tolist() == [-1, -1, 1_000, 0]  # 4000 - 6000 overlaps: 0
    assert session_notes(frame, "t.csv") == ()
    frame = _frame(think_time_us=[None, None, 123, None])
    assert find_sessions(frame).think_us.tolist() == [-1, -1, 123, 4_000]


def test_negative_think_time_and_no_sessions_are_errors():
    with pytest.raises(TraceError, match="row 2 .request_id 2.: think_time_us is negative"):
        _frame(think_time_us=[None, None, -5, None])  # refused as the trace is read
    with pytest.raises(ConfigError, match="trace.closed_loop: true, but the trace has no session_id"):
        check_closed_loop(_frame(session_id=[None] * 4), "fleet.yaml")
