"""`trace: {closed_loop: true}`: a BLIS TraceV2 log with sessions replayed closed-loop by the CLI."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from tests.e2e.conftest import read_run, small_fleet

HEADER = ("request_id,client_id,tenant_id,slo_class,session_id,round_index,prefix_group,prefix_length,streaming,"
          "input_tokens,output_tokens,text_tokens,image_tokens,audio_tokens,video_tokens,reason_ratio,model,"
          "deadline_us,server_input_tokens,arrival_time_us,send_time_us,first_chunk_time_us,last_chunk_time_us,"
          "num_chunks,status,error_message,finish_reason")


def _row(i, session, arrival_us, prompt, output, e2e_us):
    return (f"{i},c1,acme,interactive,{session},0,,0,true,{prompt},{output},{prompt},0,0,0,0,llama-8b,0,0,"
            f"{arrival_us},{arrival_us},{arrival_us + 50_000},{arrival_us + e2e_us},{output},ok,,stop")


# s1: three turns 2 s apart, each observed to take 1.5 s (think time 0.5 s); s2: two turns; one
# request without a session.
ROWS = [_row(0, "s1", 1_000_000, 400, 50, 1_500_000), _row(1, "", 1_200_000, 300, 20, 900_000),
        _row(2, "s2", 1_300_000, 200, 40, 1_000_000), _row(3, "s1", 3_000_000, 480, 30, 1_500_000),
        _row(4, "s2", 3_300_000, 260, 10, 1_000_000), _row(5, "s1", 5_000_000, 540, 20, 1_500_000)]


def _trace(write, rows=ROWS) -> Path:
    return write("sessions.csv", "\n".join([HEADER, *rows]) + "\n")


def test_closed_loop_run_releases_turns_after_the_previous_one(cli, write):
    trace = _trace(write)
    config = write("fleet.yaml", small_fleet(f"{{path: {trace}, closed_loop: true}}"))
    result = cli("run", "--config", config, "--out", "out", "--quiet")
    assert result.code == 0, result.err
    run = read_run(Path("out"))
    assert run.summary["closed_loop"] == {"sessions": 2, "later_turns": 3, "think_time_assumed": 0,
                                          "rejected_turns_continued": 0}
    requests = run.requests.sort("request_id")
    assert "recorded_arrival_us" in requests.columns
    assert requests["recorded_arrival_us"].to_list() == [0, 200_000, 300_000, 2_000_000, 2_300_000, 4_000_000]
    assert (requests["status"] == "finished").all()
    rows = {r["request_id"]: r for r in requests.iter_rows(named=True)}
    # each later turn is sent its recorded think time (gap - observed e2e = 0.5 s) after the client saw
    # the turn before it finish; first turns and the sessionless request keep their recorded arrival
    for before, after in ((0, 3), (3, 5), (2, 4)):
        think = 1_000_000 if before == 2 else 500_000
        assert rows[after]["arrival_us"] == rows[before]["finished_us"] + think
    for first in (0, 1, 2):
        assert rows[first]["arrival_us"] == rows[first]["recorded_arrival_us"]
    # (a BLIS log has no per-block prefix hashes, so no prefix hit here: tests/differential/test_closed_loop.py)


def test_open_loop_run_of_the_same_trace_keeps_its_shape(cli, write):
    trace = _trace(write)
    result = cli("run", trace, "--out", "out", "--quiet")
    assert result.code == 0, result.err
    requests = pl.read_parquet("out/requests.parquet").sort("request_id")
    assert "recorded_arrival_us" not in requests.columns
    assert requests["arrival_us"].to_list() == [0, 200_000, 300_000, 2_000_000, 2_300_000, 4_000_000]


def test_closed_loop_without_sessions_is_one_line_exit_2_and_no_run(cli, write):
    rows = [r.replace(",s1,", ",,").replace(",s2,", ",,") for r in ROWS]
    trace = _trace(write, rows)
    config = write("fleet.yaml", small_fleet(f"{{path: {trace}, closed_loop: true}}"))
    result = cli("run", "--config", config, "--out", "out")
    assert result.code == 2
    assert result.err.strip().count("\n") == 0
    assert "trace.closed_loop" in result.err and "session_id" in result.err
    assert not Path("out").exists()


def test_closed_loop_must_be_a_boolean(cli, write):
    config = write("fleet.yaml", small_fleet("{closed_loop: sometimes}"))
    result = cli("run", "--config", config, "--out", "out")
    assert result.code == 2
    assert "closed_loop" in result.err
