"""The run directory's schema is declared once (replay/outputs/schema.py): what the replay writes is
exactly what it declares, file by file and column by column, and the dashboard reads only columns
it declares, so the writer and the reader cannot drift apart."""

from __future__ import annotations

import polars as pl
import pytest

from replay.outputs import schema
from tests.tui.conftest import BEFORE


def _dtypes(frame: pl.DataFrame) -> dict:
    return {name: dtype for name, dtype in frame.schema.items()}


def test_a_finished_run_holds_the_declared_files_and_columns(one_pool_run, pd_run):
    for run in (one_pool_run, pd_run):
        assert sorted(p.name for p in run.iterdir()) == sorted((*schema.RUN_FILES, schema.TIMING_FILE))
        for table in schema.TABLES:
            frame = pl.read_parquet(run / table.file)
            assert frame.columns == list(table.names), (run.name, table.file)
            assert _dtypes(frame) == table.dtypes, (run.name, table.file)
            assert pl.read_parquet_metadata(run / table.file)[schema.SCHEMA_KEY] == str(schema.SCHEMA_VERSION)
            for name in table.not_null:
                assert frame[name].null_count() == 0, (table.file, name)
            if table.unique:
                assert not frame.select(pl.struct(table.unique).is_duplicated()).to_series().any()


def test_a_live_run_holds_the_declared_chunks(tmp_path):
    from tests.tui.test_live import live_until

    writer, _ = live_until(tmp_path / "run", ticks=6)
    live = tmp_path / "run" / schema.LIVE_DIR
    tables = {"ticks": schema.TICKS, "events": schema.EVENTS, "requests": schema.REQUESTS, "firsts": schema.FIRSTS}
    for seq in range(1, writer.seq + 1):
        chunk = live / schema.chunk_name(seq)
        assert sorted(p.name for p in chunk.iterdir()) == sorted(f"{n}.parquet" for n in schema.CHUNK_FILES)
        for name in schema.CHUNK_FILES:
            frame = pl.read_parquet(chunk / f"{name}.parquet")
            assert _dtypes(frame) == tables[name].dtypes, (seq, name)
    inflight = pl.read_parquet(live / schema.inflight_name(writer.seq))
    assert _dtypes(inflight) == schema.REQUESTS.dtypes
    assert (live / schema.STATUS_FILE).is_file()


def test_the_values_a_run_holds_are_declared(one_pool_run, pd_run):
    """Statuses, event kinds and saturation classes: the writer's constants are the declared
    ones, and a run holds no other."""
    import json

    from replay.engine.common import EVENT_NAMES
    from replay.fleet.saturation import CLASSES

    assert set(EVENT_NAMES) <= set(schema.EVENT_KINDS) and tuple(CLASSES) == schema.SATURATION_CLASSES
    for run in (one_pool_run, pd_run, BEFORE):
        assert set(pl.read_parquet(run / schema.EVENTS_FILE)["kind"]) <= set(schema.EVENT_KINDS)
        assert set(pl.read_parquet(run / schema.REQUESTS_FILE)["status"]) <= set(schema.STATUSES)
    for run in (one_pool_run, pd_run):  # (the committed fixtures predate the saturation class)
        pools = json.loads((run / schema.SUMMARY_FILE).read_text())["pools"].values()
        assert {p["saturation"]["class"] for p in pools} <= set(schema.SATURATION_CLASSES)


def test_the_dashboard_reads_declared_columns_only():
    """Each table the dashboard reads is the writer's, every column it needs is one the writer
    declares (a first-contract one, or one appended as long ago as the committed fixtures), and it
    refuses to be built over an undeclared one."""
    from tui import validate

    reads = {validate.TICKS: schema.TICKS, validate.EVENTS: schema.EVENTS, validate.REQUESTS: schema.REQUESTS,
             validate.FIRSTS: schema.FIRSTS}
    for read, table in reads.items():
        assert read.table is table
        assert set(read.needed) <= set(table.names)
        assert set(read.kinds) == set(table.names) and None not in read.kinds.values()
    for table in schema.TABLES:  # a committed fixture run, written long ago, still has every needed column
        assert set(next(r for r, t in reads.items() if t is table).needed) <= set(
            pl.read_parquet(BEFORE / table.file).columns)
    with pytest.raises(ValueError, match="ttft_ms.*does not declare"):
        validate.Reads(schema.TICKS, ("t_us", "ttft_ms"))
