"""A damaged run directory is one line and exit code 2 from `llm-replay tui`, naming the file, the
column or key, the value and what was expected; and the dashboard's declared schema is the one
the replay writes."""

from __future__ import annotations

import shutil

import polars as pl
import pytest

from tests.tui.conftest import BEFORE


def _ticks_twice(run):
    ticks = pl.read_parquet(run / "ticks.parquet")
    pl.concat([ticks, ticks.slice(5, 1)]).write_parquet(run / "ticks.parquet")


def _rewrite(name, **columns):
    def damage(run):
        frame = pl.read_parquet(run / name)
        frame.with_columns(**columns).write_parquet(run / name)
    return damage


def _write(name, text):
    def damage(run):
        (run / name).write_text(text)
    return damage


def _truncate(name, keep):
    def damage(run):
        body = (run / name).read_bytes()
        (run / name).write_bytes(body[:keep])
    return damage


def _set_config(old, new):
    def damage(run):
        text = (run / "config.yaml").read_text()
        assert old in text
        (run / "config.yaml").write_text(text.replace(old, new, 1))
    return damage


DAMAGES = {
    "tick_s text": (_set_config("tick_s: 1.0", "tick_s: abc"), "config.yaml: tick_s: got 'abc', expected a number > 0"),
    "window zero": (_set_config("metrics_window_s: 60.0", "metrics_window_s: 0"),
                    "config.yaml: metrics_window_s: got 0, expected a number > 0"),
    "slo text": (_set_config("ttft_ms: 2000.0", "ttft_ms: fast"), "config.yaml: slo.ttft_ms: got 'fast'"),
    "slo list": (_set_config("slo:", "slo: [1]\nold_slo:"), "config.yaml: slo: got [1], expected a mapping"),
    "config yaml": (_write("config.yaml", "tick_s: [1\n"), "config.yaml line 2: not valid YAML"),
    # a crafted config.yaml cannot expand in the dashboard either (the bounded reader of every input)
    "config bomb": (_write("config.yaml", "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(8))), "config.yaml line 6: expands to more than 200,000 values"),
    "duplicated tick": (_ticks_twice, "ticks.parquet: row 5 (t_us 6000000, pool 'shared') appears again at row 372; "
                                      "expected one row per t_us and pool"),
    "infinite ttft": (_rewrite("ticks.parquet", ttft_p99_ms=pl.when(pl.col("t_us") == 3_000_000)
                               .then(float("inf")).otherwise(pl.col("ttft_p99_ms"))),
                      "ticks.parquet: row 2 (t_us 3000000, pool 'shared'): ttft_p99_ms is inf; expected a finite "
                      "number or null"),
    "nan busy": (_rewrite("ticks.parquet", gpu_busy=pl.when(pl.col("t_us") == 2_000_000).then(float("nan"))
                          .otherwise(pl.col("gpu_busy"))), "gpu_busy is nan; expected a finite number or null"),
    "negative times": (_rewrite("events.parquet", t_us=pl.col("t_us") - 10**12),
                       "t_us is -"),
    "times in seconds x 1e6": (_rewrite("events.parquet", t_us=pl.col("t_us") * 10**9),
                               "t_us is 1"),
    "a pool not in the config": (_rewrite("ticks.parquet", pool=pl.when(pl.col("pool") == "shared")
                                          .then(pl.lit("zzz")).otherwise(pl.col("pool"))),
                                 "ticks.parquet: rows for pool 'zzz', which the run's config.yaml does not have"),
    "tick_s huge": (_set_config("tick_s: 1.0", "tick_s: 1.0e+300"),
                    "config.yaml: tick_s: got 1e+300, expected at most 3,600 seconds"),
    "string tick times": (_rewrite("ticks.parquet", t_us=pl.col("t_us").cast(pl.String)),
                          "ticks.parquet: column 't_us' is String (first value '1000000'); expected an integer "
                          "type (int64)"),
    "string arrivals": (_rewrite("requests.parquet", arrival_us=pl.col("arrival_us").cast(pl.String) + "us"),
                        "requests.parquet: column 'arrival_us' is String (first value '0us'); expected an integer"),
    "float event times": (_rewrite("events.parquet", t_us=pl.col("t_us") / 1e6),
                          "events.parquet: column 't_us' is Float64"),
    "unknown status": (_rewrite("requests.parquet", status=pl.when(pl.col("request_id") == 7).then(pl.lit("done"))
                                .otherwise(pl.col("status"))),
                       "requests.parquet: row 7 (request_id 7): status 'done'; expected one of finished, rejected, "
                       "unfinished"),
    "null status": (_rewrite("requests.parquet", status=pl.when(pl.col("request_id") == 3).then(None)
                             .otherwise(pl.col("status"))),
                    "requests.parquet: row 3 (request_id 3): status is null; expected a value"),
    "repeated request": (_rewrite("requests.parquet", request_id=pl.col("request_id").clip(upper_bound=10)),
                         "requests.parquet: row 10 (request_id 10) appears again at row 11"),
    "text slo_met": (_rewrite("requests.parquet", slo_met=pl.col("slo_met").cast(pl.String)),
                     "requests.parquet: column 'slo_met' is String (first value 'true'); expected a boolean"),
    "unreadable parquet": (_truncate("requests.parquet", 200), "requests.parquet: not a readable parquet file"),
    "truncated summary": (_truncate("summary.json", 300), "summary.json: not valid JSON, truncated or damaged?"),
    "missing ticks": (lambda run: (run / "ticks.parquet").unlink(), "not a run directory (missing ticks.parquet)"),
}


@pytest.mark.parametrize("damage, fragment", list(DAMAGES.values()), ids=list(DAMAGES))
def test_a_damaged_run_is_one_line_naming_what_is_wrong(cli, tmp_path, monkeypatch, damage, fragment):
    from tui.app import Dashboard

    monkeypatch.setattr(Dashboard, "run", lambda self: pytest.fail("drew a damaged run"))
    run = tmp_path / "damaged"
    shutil.copytree(BEFORE, run)
    damage(run)
    for argv in (["damaged"], [BEFORE, "--compare", "damaged"], ["damaged", "--screenshot", "x.svg"]):
        code, out, err = cli("tui", *argv)
        assert code == 2, (argv, out, err)
        assert err.startswith("llm-replay: error: damaged") and err.count("\n") == 1, err
        assert fragment in err and "Traceback" not in err and not out
    assert not (tmp_path / "x.svg").exists()


def test_the_schema_is_the_one_the_replay_writes(one_pool_run, pd_run):
    """Every declared column is one replay.fleet.metrics writes, of the kind it writes (so a run the
    replay wrote always passes, and the two cannot drift apart)."""
    import replay.fleet.metrics as metrics
    from tui.data import load_run
    from tui.validate import EVENTS, REQUESTS, TICKS, _fits

    for schema, written in ((TICKS, metrics.TICK_COLUMNS), (REQUESTS, metrics.REQUEST_COLUMNS)):
        assert set(schema.columns) | set(schema.optional) <= set(written)
    for run in (one_pool_run, pd_run, BEFORE):
        for name, schema in (("ticks", TICKS), ("events", EVENTS), ("requests", REQUESTS)):
            frame = pl.read_parquet(run / f"{name}.parquet")
            for column, kind in {**schema.columns, **schema.optional}.items():
                if column in frame.columns:
                    assert _fits(frame.schema[column], kind), (run, name, column, frame.schema[column])
        assert load_run(run).requests.height > 0


def test_a_screenshot_that_cannot_be_written_is_one_line(cli, tmp_path):
    (tmp_path / "shot.svg").mkdir()  # a directory where the file should go
    code, out, err = cli("tui", BEFORE, "--screenshot", "shot.svg", "--size", "80x24")
    assert code == 2 and err.startswith("llm-replay: error: --screenshot shot.svg: is a directory")
    assert err.count("\n") == 1 and not out
