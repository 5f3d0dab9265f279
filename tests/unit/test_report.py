"""The CLI's progress and figures in the units a person reads."""

import polars as pl

from replay.cluster import simulate
from replay.config import FleetConfig, PoolConfig
from replay.report import human_ms, human_span, progress_state
from traces import cast_to_schema


def test_progress_keeps_moving_while_the_fleet_drains():
    frame = cast_to_schema(pl.DataFrame({"arrival_us": [0, 1_000], "prompt_tokens": [2_000, 2_000],
                                         "output_tokens": [3_000, 3_000]}), source="t")
    calls = []
    simulate(frame, None, FleetConfig(model="llama-3.1-8b", pools=(PoolConfig(replicas=1),)),
             progress=lambda done, total: calls.append((done, total)))
    done, total = calls[-1]
    assert done > total  # 3,000 output tokens take far longer than the 1 ms of arrivals
    assert progress_state(done, total) == (None, f"arrivals done; draining for {(done - total) / 1e6:,.0f} s")
    assert progress_state(500_000, 2_000_000) == (0.25, "0 / 2 s")


def test_human_units():
    assert [human_ms(x) for x in (0.42, 95.4, 2_340, 36_210, 250_000, 9_000_000)] == [
        "0.42 ms", "95 ms", "2.34 s", "36.2 s", "4.2 min", "2.5 h"]
    assert [human_span(x) for x in (4.2, 42, 605, 3_600)] == ["4.2 s", "42 s", "10 min 05 s", "1 h 00 min"]
