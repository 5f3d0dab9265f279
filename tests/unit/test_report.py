"""The CLI's progress and figures in the units a person reads."""

import polars as pl

from replay.fleet.cluster import simulate
from replay.config import FleetConfig, PoolConfig
from replay.outputs.report import human_ms, human_span, progress_state
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


def test_the_table_colours_each_pools_saturation_and_reads_an_older_summary():
    import io
    import re
    from pathlib import Path

    from rich.console import Console

    from replay.outputs.report import print_summary

    def pool(state):
        return {"requests": 10} | ({"saturation": {"class": state}} if state else {})

    summary = {"trace": "t.csv", "sim_span_s": 60.0, "requests": 30,
               "pools": {"a": pool("overloaded"), "b": pool("backlogged"), "c": pool(None)}}
    console = Console(file=io.StringIO(), width=120, record=True, force_terminal=True, color_system="truecolor")
    print_summary(console, summary, Path("out"))
    html = console.export_html(inline_styles=True, clear=False)
    row = next(line for line in console.export_text().splitlines() if "saturation" in line)
    assert [cell.strip() for cell in row.split("│")[1:-1]] == ["saturation", "overloaded", "backlogged", "-", ""]
    # rich's red and yellow
    assert re.search(r'<span style="color: #800000;[^"]*font-weight: bold">overloaded</span>', html)
    assert re.search(r'<span style="color: #808000;[^"]*">backlogged</span>', html)
