"""Reading a trace is bounded: only regular files, bounded decompression, lines and span.

Each input here is tiny but stands for one that used to hang or exhaust the machine: a FIFO,
/dev/zero, a gzip of newlines, a stray epoch timestamp among small ones.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import resource
import signal

import pytest

from common.errors import TraceError
from traces import TraceConfig, load_from_config, load_trace
from traces.limits import TraceLimits

CMAP = {"arrival": "ts", "prompt_tokens": "p", "output_tokens": "o"}


@contextlib.contextmanager
def deadline(seconds: int = 20):
    """A hang (reading a FIFO nobody writes) fails the test instead of stopping the suite."""

    def expired(*_):
        raise AssertionError(f"still reading after {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def error(path, **kw) -> str:
    with deadline(), pytest.raises(TraceError) as err:
        load_trace(path, **kw)
    return str(err.value)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    assert error(fifo) == f"{fifo}: is a FIFO (named pipe), not a regular file (expected a trace file)"


def test_a_character_device_is_refused_before_any_byte_is_read():
    assert error("/dev/zero") == "/dev/zero: is a character device, not a regular file (expected a trace file)"


def test_a_fifo_in_a_config_trace_section_is_refused(tmp_path):
    os.mkfifo(tmp_path / "live.csv")
    with deadline(), pytest.raises(TraceError, match="live.csv: is a FIFO"):
        load_from_config(TraceConfig(path="live.csv"), base_dir=tmp_path)


def test_a_merged_fifo_is_refused(tmp_path):
    from traces import MergeSource

    (tmp_path / "a.csv").write_text("ts,p,o\n0,1,1\n")
    os.mkfifo(tmp_path / "b.csv")
    cfg = TraceConfig(path="a.csv", format="csv", column_map=CMAP,
                      merge=(MergeSource(path="b.csv", format="csv", column_map=CMAP),))
    with deadline(), pytest.raises(TraceError, match="b.csv: is a FIFO"):
        load_from_config(cfg, base_dir=tmp_path)


def test_a_large_binary_file_is_refused_from_its_first_bytes(tmp_path):
    # A sparse 1.5 GB file of zeros: refusing it must not read it into memory.
    big = tmp_path / "zeros.csv"
    with big.open("wb") as fh:
        fh.truncate(1536 << 20)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert "not a text file (byte 0x00 at offset 0)" in error(big)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 256


def test_a_plain_file_over_the_byte_bound_is_refused_before_reading(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("ts,p,o\n" + "0,1,1\n" * 1000)
    message = error(path, format="csv", column_map=CMAP, limits=TraceLimits(max_bytes=1024))
    assert message == f"{path}: 5.9 KiB, more than the bound of 1.0 KiB (--max-trace-bytes raises it)"


def test_a_gzip_bomb_stops_at_the_byte_bound(tmp_path):
    bomb = tmp_path / "bomb.csv.gz"
    bomb.write_bytes(gzip.compress(b"ts,p,o\n" + b"\n" * (8 << 20)))
    assert bomb.stat().st_size < 64 << 10
    message = error(bomb, format="csv", column_map=CMAP, limits=TraceLimits(max_bytes=1 << 20))
    assert message == f"{bomb}: decompresses to more than the bound of 1.0 MiB (--max-trace-bytes raises it)"


def test_a_gzip_of_many_tiny_rows_stops_at_the_line_bound(tmp_path):
    rows = tmp_path / "rows.csv.gz"
    rows.write_bytes(gzip.compress(b"ts,p,o\n" + b"0,1,1\n" * 200_000))
    message = error(rows, format="csv", column_map=CMAP, limits=TraceLimits(max_rows=100_000))
    assert message == f"{rows}: more than 100,000 lines, the bound on rows (--max-rows raises it)"


def test_a_gzip_of_newlines_stops_at_the_line_bound_before_the_byte_bound(tmp_path):
    bomb = tmp_path / "newlines.csv.gz"
    bomb.write_bytes(gzip.compress(b"\n" * (8 << 20)))
    message = error(bomb, format="csv", column_map=CMAP, limits=TraceLimits(max_rows=1000))
    assert message == f"{bomb}: more than 1,000 lines, the bound on rows (--max-rows raises it)"


def test_cr_only_lines_count_against_the_line_bound(tmp_path):
    path = tmp_path / "cr.csv"
    path.write_bytes(b"ts,p,o\r" + b"0,1,1\r" * 50)
    assert "more than 10 lines" in error(path, format="csv", column_map=CMAP, limits=TraceLimits(max_rows=10))


def test_the_default_bounds_protect_memory():
    limits = TraceLimits()
    assert limits.max_bytes <= 4 << 30 and limits.max_rows <= 50_000_000 and limits.max_span_s == 31 * 86400


@pytest.mark.parametrize("kw, flag", [({"max_bytes": 0}, "--max-trace-bytes"), ({"max_bytes": 5 << 30}, "4 GiB"),
                                      ({"max_rows": 0}, "--max-rows"), ({"max_span_s": float("inf")}, "--max-span-s")])
def test_bounds_are_themselves_bounded(kw, flag):
    with pytest.raises(ValueError, match=flag):
        TraceLimits(**kw)


def test_a_stray_epoch_timestamp_names_the_rows_that_stretch_the_span(tmp_path):
    path = tmp_path / "epoch.csv"
    path.write_text("ts,p,o\n0,1,1\n1,1,1\n1700000000,1,1\n")
    message = error(path, format="csv", column_map=CMAP)
    assert message.startswith(f"{path} line 4 arrives at 1,700,000,000 s, 54 years after line 3 (1 s): ")
    assert "more than the bound of 31 days" in message and "--max-span-s" in message and "time unit" in message


def test_a_longer_span_is_allowed_by_raising_the_bound(tmp_path):
    path = tmp_path / "long.csv"
    path.write_text("ts,p,o\n0,1,1\n3000000,1,1\n")  # 34.7 days
    assert "line 3 arrives" in error(path, format="csv", column_map=CMAP)
    trace = load_trace(path, format="csv", column_map=CMAP, limits=TraceLimits(max_span_s=40 * 86400))
    assert trace.frame["arrival_us"].to_list() == [0, 3_000_000_000_000]


def test_rate_scaling_cannot_stretch_a_trace_past_the_span_bound(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("ts,p,o\n0,1,1\n100,1,1\n")
    with pytest.raises(TraceError, match=r"after merge offsets and rate_scale the trace spans 3.2 years, more than "
                                         r"the bound of 31 days \(--max-span-s raises it\)"):
        load_from_config(TraceConfig(path=str(path), format="csv", column_map=CMAP, rate_scale=1e-6))


@pytest.mark.parametrize("value", [1e-300, 1e300, 0.0, float("nan")])
def test_rate_scale_is_bounded(value):
    with pytest.raises(ValueError, match=r"rate_scale=.* \(expected a number in \[1e-06, 1e\+06\]\)"):
        TraceConfig(rate_scale=value)


def test_prefix_block_tokens_is_bounded():
    with pytest.raises(ValueError, match=r"prefix_block_tokens=1267650600228229401496703205376 \(expected an integer "
                                         r"in 1..1,048,576\)"):
        TraceConfig(prefix_block_tokens=2**100)
    with pytest.raises(TraceError, match=r"prefix_block_tokens=0 \(expected an integer in 1..1,048,576\)"):
        load_trace("mooncake-synthetic", prefix_block_tokens=0)


def test_a_gzip_of_one_long_line_stops_at_the_line_bound(tmp_path):
    # The tester's 1.8 MB .gz of one 1.9 GB line used 11 GB; a small bound shows the same stop.
    bomb = tmp_path / "w.csv.gz"
    bomb.write_bytes(gzip.compress(b"ts,p,o\n0,1,1\n0,1,1" + b"9" * (4 << 20) + b"\n"))
    message = error(bomb, format="csv", column_map=CMAP, limits=TraceLimits(max_line_bytes=1 << 20))
    assert message == f"{bomb} line 3: longer than the bound of 1.0 MiB per line (--max-line-bytes raises it)"


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"])
def test_lines_up_to_the_line_bound_load_and_a_longer_last_line_is_refused(tmp_path, ending):
    path = tmp_path / "t.csv"
    row = b"0,1,1," + b"x" * 94  # 100 bytes
    path.write_bytes(ending.join([b"ts,p,o,pad", row, row]) + ending)
    limits = TraceLimits(max_line_bytes=100)
    assert load_trace(path, format="csv", column_map=CMAP, limits=limits).frame.height == 2
    for last in (ending, b""):  # the last line, with or without its line ending
        path.write_bytes(ending.join([b"ts,p,o,pad", row, row + b"x"]) + last)
        assert "line 3: longer than the bound of 100 bytes per line" in error(path, format="csv", column_map=CMAP,
                                                                              limits=limits)


def test_the_default_line_bound_leaves_room_for_every_bundled_trace():
    from traces.bundled import BUNDLED

    for name in BUNDLED:
        assert load_trace(name).frame.height > 0
    assert TraceLimits().max_line_bytes >= 256 * 1024


def test_lines_are_bounded_across_the_blocks_the_file_is_read_in(tmp_path, monkeypatch):
    from traces import source

    monkeypatch.setattr(source, "_CHUNK_BYTES", 7)  # every line crosses a block boundary
    path = tmp_path / "t.csv"
    rows = [b"0,1,1," + b"x" * n for n in (10, 30, 20, 34, 5)]  # the 4th row (line 5) is 40 bytes
    path.write_bytes(b"ts,p,o,pad\n" + b"\n".join(rows) + b"\n")
    assert "line 5: longer than the bound of 39 bytes" in error(path, format="csv", column_map=CMAP,
                                                                limits=TraceLimits(max_line_bytes=39))
    assert load_trace(path, format="csv", column_map=CMAP, limits=TraceLimits(max_line_bytes=40)).frame.height == 5
