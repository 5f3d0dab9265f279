"""A large run's request rows go to requests.parquet itself as they come (replay/outputs/rows.py):
the file is the one polars' sink makes of the same chunks at the end, byte for byte; the run's
write takes it as it is (a hard link) when its metadata is the run's, else rewrites it; a sink
that fails is one line naming --out and leaves nothing; rows dropped midway leave nothing."""

from __future__ import annotations

import errno
import gc
import hashlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from common.errors import UserError
from replay.outputs.rows import RequestRows
from replay.outputs.write import write_parquet

META = {"llm_replay.schema": "1", "llm_replay.version": "0.1.0", "llm_replay.config_sha256": "c",
        "llm_replay.trace_sha256": "t"}


def _chunks(n: int = 12, rows: int = 2500) -> list[pl.DataFrame]:
    """Chunks as RowMaker's: some columns in pieces (the trace's batches), some whole."""
    rng = np.random.default_rng(7)
    out = []
    for i in range(n):
        first = pl.concat([pl.Series("arrival_us", rng.integers(0, 10**9, size))
                           for size in (rows // 3, rows - rows // 3)], rechunk=False)
        ttft = rng.integers(-1, 10**6, rows)
        out.append(pl.DataFrame({
            "request_id": np.arange(i * rows, (i + 1) * rows),
            "arrival_us": first,
            "ttft_us": pl.Series(ttft).replace(-1, None),
            "status": pl.Series(["finished", "rejected"]).gather(rng.integers(0, 2, rows)),
        }))
    return out


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".run.tmp-"))


def test_rows_past_the_memory_go_to_one_file_that_is_the_runs_requests_parquet(tmp_path):
    chunks = _chunks()
    expected = tmp_path / "expected.parquet"
    write_parquet(pl.concat(chunks, rechunk=False).lazy(), expected, META)
    rows = RequestRows(spill_dir=tmp_path / "run", memory_rows=6000, metadata=META)
    for chunk in chunks:
        rows.append(chunk)
    assert rows.spilled and rows.height == sum(c.height for c in chunks)
    [folder] = _leftovers(tmp_path)
    assert "-rows-" in folder
    assert_frame_equal(rows.lazy().collect(), pl.concat(chunks))
    assert_frame_equal(rows.collect(), pl.concat(chunks))
    (tmp_path / "out").mkdir()
    rows.write(tmp_path / "out" / "requests.parquet", dict(META), write_parquet)
    assert _digest(tmp_path / "out" / "requests.parquet") == _digest(expected)
    assert os.stat(tmp_path / "out" / "requests.parquet").st_nlink == 2  # linked, not encoded again
    # another run's metadata (or the same in another order: the footer's bytes differ) is written anew
    other = {**META, "llm_replay.version": "9"}
    rows.write(tmp_path / "out" / "other.parquet", other, write_parquet)
    assert pl.read_parquet_metadata(tmp_path / "out" / "other.parquet")["llm_replay.version"] == "9"
    assert_frame_equal(pl.read_parquet(tmp_path / "out" / "other.parquet"), pl.concat(chunks))
    del rows
    gc.collect()
    assert _leftovers(tmp_path) == []
    # the run's link stays
    assert_frame_equal(pl.read_parquet(tmp_path / "out" / "requests.parquet"), pl.concat(chunks))


def test_rows_without_a_run_to_be_are_written_from_their_file_with_the_runs_metadata(tmp_path):
    chunks = _chunks(5)
    expected = tmp_path / "expected.parquet"
    write_parquet(pl.concat(chunks, rechunk=False).lazy(), expected, META)
    rows = RequestRows(memory_rows=3000)  # no metadata known before the rows: rewritten at the write
    for chunk in chunks:
        rows.append(chunk)
    rows.settle()
    rows.write(tmp_path / "requests.parquet", META, write_parquet)
    assert _digest(tmp_path / "requests.parquet") == _digest(expected)


def test_a_disk_that_fills_under_the_rows_file_is_one_line_naming_out_and_leaves_nothing(tmp_path, monkeypatch):
    import replay.outputs.write as outputs

    real_open = open

    class Full:
        def __init__(self, path, mode):
            self.fh = real_open(path, mode)

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

    monkeypatch.setattr(outputs, "open", Full, raising=False)
    rows = RequestRows(spill_dir=tmp_path / "run", memory_rows=100, metadata=META)
    with pytest.raises(UserError) as caught:
        for chunk in _chunks(40):
            rows.append(chunk)
        rows.settle()
    message = str(caught.value)
    assert message.startswith(f"--out {tmp_path / 'run'}: cannot write the run's request rows to ")
    assert "No space left on device" in message and message.endswith("nothing written")
    assert "\n" not in message
    assert _leftovers(tmp_path) == []


def test_rows_dropped_before_they_settle_stop_their_writer_and_leave_nothing(tmp_path):
    rows = RequestRows(spill_dir=tmp_path / "run", memory_rows=100, metadata=META)
    for chunk in _chunks(4):
        rows.append(chunk)
    assert len(_leftovers(tmp_path)) == 1
    writers = [t for t in threading.enumerate() if t.name == "llm-replay request rows"]
    assert writers
    del rows
    gc.collect()
    assert _leftovers(tmp_path) == []
    assert not any(writer.is_alive() for writer in writers)  # stopped, not left to the interpreter's exit


@pytest.mark.parametrize("how", ["caught, then exit 2", "uncaught"])
def test_a_run_that_fails_midway_exits_with_its_own_code(tmp_path, how):
    """The writer thread is stopped before the interpreter exits: left inside polars' sink, it
    aborted the process (exit 134) now and then."""
    script = f"""
import sys
import polars as pl
from replay.outputs.rows import RequestRows
rows = RequestRows(spill_dir={str(tmp_path / "run")!r}, memory_rows=100)
try:
    for i in range(40):
        rows.append(pl.DataFrame({{"request_id": list(range(i * 50, i * 50 + 50))}}))
    raise RuntimeError("midway")
except RuntimeError:
    if {how == "uncaught"}:
        raise
    del rows
    sys.exit(2)
"""
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert done.returncode == (2 if how != "uncaught" else 1), done.stderr
        assert "FATAL" not in done.stderr
    assert _leftovers(tmp_path) == []
