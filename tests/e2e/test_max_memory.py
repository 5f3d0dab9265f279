"""`run --max-memory`: a trace too large for the memory allowed is refused before it is read, with
the estimate; the estimate's row count is the trace's own (issue 15, "Bad input")."""

from __future__ import annotations

import gzip
import os

import polars as pl

from replay import memory
from traces import TraceConfig, load_trace
from traces.transforms import SampleConfig
from traces.whatif import WhatIfConfig
from tests.e2e.conftest import small_fleet

CSV = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
    f"2023-11-16 18:15:{s:02d}.0,{100 + s},{10 + s}\n" for s in range(40))


def refused(res) -> str:
    assert res.code == 2 and res.out == "", (res.code, res.err)
    assert len(res.err.splitlines()) == 1 and "Traceback" not in res.err, res.err
    return res.err


def test_a_trace_over_max_memory_is_refused_before_it_is_read(cli, write, tmp_path, monkeypatch):
    write("trace.csv", CSV)
    write("fleet.yaml", small_fleet("{path: trace.csv}"))

    def never(*_a, **_k):
        raise AssertionError("the trace was read")

    monkeypatch.setattr("traces.load_from_config", never)
    limit = memory.BASELINE_BYTES + 10 * memory.BYTES_PER_REQUEST  # room for 10 of its 41 lines
    err = refused(cli("run", "--config", "fleet.yaml", "--out", "out", "--max-memory", str(limit)))
    expected = memory.BASELINE_BYTES + 41 * memory.BYTES_PER_REQUEST  # 40 rows and the header
    assert err.startswith("llm-replay: error: fleet.yaml: the trace holds up to 41 requests"), err
    assert f"estimated peak of {memory.human_bytes(expected)}" in err
    assert f"more than --max-memory of {memory.human_bytes(limit)}" in err
    assert "--window, --sample" in err and "raise --max-memory" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.yaml", "trace.csv"]


def test_a_trace_within_max_memory_runs(cli, write):
    write("trace.csv", CSV)
    write("fleet.yaml", small_fleet("{path: trace.csv}"))
    res = cli("run", "--config", "fleet.yaml", "--out", "out", "-q", "--max-memory", "64GiB")
    assert res.code == 0, res.err


def test_the_default_limit_is_the_memory_the_machine_has(cli, write, monkeypatch):
    write("trace.csv", CSV)
    write("fleet.yaml", small_fleet("{path: trace.csv}"))
    monkeypatch.setattr(memory, "available_bytes", lambda: memory.BASELINE_BYTES)
    err = refused(cli("run", "--config", "fleet.yaml", "--out", "out"))
    assert "more than the memory available (MemAvailable or the cgroup limit)" in err
    assert "pass a larger --max-memory" in err


def test_rows_come_from_the_parquet_footer_or_the_line_endings(tmp_path):
    frame = pl.DataFrame({"arrival_us": [0, 5, 9], "prompt_tokens": [1, 2, 3], "output_tokens": [1, 1, 1]})
    frame.write_parquet(tmp_path / "t.parquet")
    (tmp_path / "t.csv").write_text(CSV)
    (tmp_path / "t.csv.gz").write_bytes(gzip.compress(CSV.encode()))
    (tmp_path / "unended.csv").write_text(CSV.rstrip("\n"))
    assert memory.count_rows(str(tmp_path / "t.parquet")) == 3
    assert memory.count_rows(str(tmp_path / "t.csv")) == 41
    assert memory.count_rows(str(tmp_path / "t.csv.gz")) == 41
    assert memory.count_rows(str(tmp_path / "unended.csv")) == 41
    assert memory.count_rows(str(tmp_path / "missing.csv")) == 0  # the loader says what is wrong
    bundled = memory.count_rows("azure-conv-2023")
    assert bundled >= load_trace("azure-conv-2023").frame.height


def test_the_estimate_bounds_what_the_trace_section_can_make(tmp_path):
    (tmp_path / "a.csv").write_text(CSV)
    path = str(tmp_path / "a.csv")
    assert memory.estimate_run(TraceConfig(path=path)).rows == 41
    assert memory.estimate_run(TraceConfig(path=path, sample=SampleConfig(n=5))).rows == 5
    assert memory.estimate_run(TraceConfig(path=path, sample=SampleConfig(fraction=0.5))).rows == 20
    assert memory.estimate_run(TraceConfig(path=path, whatif=WhatIfConfig(grow_rate=2.0))).rows == 82
    assert memory.estimate_run(TraceConfig(synthetic={"seed": 1})) is None  # known only once drawn


def test_the_cgroup_limit_lowers_what_the_machine_has(monkeypatch, tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 100 kB\nMemAvailable:   8000000 kB\n")
    real = memory.Path

    def path(p):
        return real(meminfo) if str(p) == "/proc/meminfo" else real(p)

    monkeypatch.setattr(memory, "Path", path)
    monkeypatch.setattr(memory, "_cgroup_limits", lambda: [])
    assert memory.available_bytes() == 8_000_000 * 1024
    monkeypatch.setattr(memory, "_cgroup_limits", lambda: [2 << 30])
    assert memory.available_bytes() == 2 << 30


def test_a_fifo_or_a_device_is_not_opened_to_count_it(cli, tmp_path):
    """The count opens regular files only: a FIFO would wait for a writer, /dev/zero never end;
    the loader then refuses each by its kind, as without the estimate."""
    os.mkfifo(tmp_path / "pipe.csv")
    assert memory.count_rows(str(tmp_path / "pipe.csv")) == 0 and memory.count_rows("/dev/zero") == 0
    err = refused(cli("run", "pipe.csv", "--out", "out"))
    assert "pipe.csv: is a FIFO (named pipe), not a regular file" in err, err


def test_the_count_stops_at_the_trace_byte_bound(tmp_path):
    bomb = tmp_path / "bomb.csv.gz"
    bomb.write_bytes(gzip.compress(b"0,1,1\n" * (4 << 20)))  # 24 MiB of lines once decompressed
    assert memory.count_rows(str(bomb), max_bytes=1 << 20) < 4 << 20  # one 16 MiB chunk read, not all 24
    assert memory.count_rows(str(bomb)) == 4 << 20


def test_a_trace_read_in_batches_is_estimated_by_what_a_streamed_replay_holds(tmp_path):
    from traces.canonical import write_canonical

    canonical = load_trace("azure-conv-2023").frame.head(30)
    write_canonical(canonical, tmp_path / "plain.parquet", None)
    hashed = load_trace("mooncake-synthetic")
    write_canonical(hashed.frame.head(30), tmp_path / "hashed.parquet", hashed.prefix_block_tokens)
    plain = TraceConfig(path=str(tmp_path / "plain.parquet"))
    streamed = memory.STREAMED_BASELINE_BYTES + 30 * memory.STREAMED_BYTES_PER_REQUEST
    assert memory.estimate_run(plain, streamed=True) == memory.Estimate(30, streamed)
    whole = memory.BASELINE_BYTES + 30 * memory.BYTES_PER_REQUEST
    assert memory.estimate_run(plain) == memory.Estimate(30, whole)  # a replay that reads it whole
    # prefix hashes: a batch's in batches (here the whole trace is one), every one read whole
    hashes = int(hashed.frame.head(30)["prefix_hashes"].list.len().sum())
    with_hashes = TraceConfig(path=str(tmp_path / "hashed.parquet"))
    assert memory.estimate_run(with_hashes, streamed=True) == memory.Estimate(
        30, streamed + memory.STREAMED_HASH_BYTES * hashes)
    assert memory.estimate_run(with_hashes) == memory.Estimate(30, whole + memory.HASH_BYTES * hashes)
    # what is read whole however it is replayed: a sample of the rows
    sampled = TraceConfig(path=plain.path, sample=SampleConfig(n=30))
    assert memory.estimate_run(sampled, streamed=True).peak_bytes == whole
