"""A run's request rows (requests.parquet's), gathered chunk by chunk as requests leave the replay,
so that a day of tens of millions of requests never stands as one frame in memory.

Chunks are held in memory while they are few (`MEMORY_ROWS`: every run of the bundled traces, and
its rows stay one frame, written whole as before). Past that, every chunk goes to requests.parquet
itself as it comes: polars' Parquet sink runs in a thread and pulls the chunks from a short queue
(`_ParquetStream`), so the rows are encoded once, in the run's own file, while the replay goes on.
The rows are then a lazy scan of that file: what the tick windows and the summary read (a few
columns at a time, row groups skipped by their statistics), and, with the metadata write_run asks
for, the run's requests.parquet as it is (a hard link into the run directory, no second encoding).

The file's bytes are those of the sink of the same chunks at the end: the sink cuts row groups at
the chunks' own boundaries (the trace batches' and the RowStream's, replay/fleet/request_rows.py),
whether it pulls them from a queue or scans them from parts (m-large's day: the same digests).
Before, the chunks were spilled as lz4 Parquet parts, read back by the summary and sunk into
requests.parquet at the write: every row encoded twice and decoded once more (m-large's day: 4.5 s
of spills, most of write_run's 7.3 s). The price: the summary and the tick windows read zstd pages,
not lz4 ones (~25% more per pass).

The file is made beside the run directory with write_run's temp prefix
(`.<out>.tmp-<pid>-<start>-rows-`), so a replay that is killed leaves nothing that the next run on
the same --out does not remove (replay/outputs/rundir.py remove_leftovers); without one it is made
in the system's temp folder. Either way it is removed when the rows are (or at exit).
"""

from __future__ import annotations

import os
import queue
import shutil
import tempfile
import threading
import weakref
from pathlib import Path

import polars as pl

from common.errors import UserError

MEMORY_ROWS = 1 << 20  # rows held in memory; past them, the rows go to the file as they come
QUEUED = 2  # chunks waiting for the sink at most (the replay waits when it is behind: bounded memory)


class RequestRows:
    """The run's request rows in id order: `append` chunks in order; `lazy`, `collect`, `write`.
    `metadata`: requests.parquet's key-value metadata, when it is known before the rows are
    (replay_trace's: version and hashes), so that a file made as the rows come is the run's."""

    def __init__(self, spill_dir: Path | None = None, memory_rows: int | None = None,
                 metadata: dict[str, str] | None = None):
        self.spill_dir = spill_dir  # the run directory to be, beside which the file is made
        self.memory_rows = max(1, MEMORY_ROWS if memory_rows is None else memory_rows)
        self.metadata = metadata
        self.height = 0
        self._held: list[pl.DataFrame] = []
        self._held_rows = 0
        self._stream: _ParquetStream | None = None
        self._file: Path | None = None  # the rows' file, once the stream to it is closed
        self._frame: pl.DataFrame | None = None  # `collect`'s, once

    @classmethod
    def of(cls, frame: pl.DataFrame) -> RequestRows:
        """Rows that are one frame already (held, never spilled)."""
        rows = cls(memory_rows=max(1, frame.height + 1))
        rows.append(frame)
        return rows

    def append(self, frame: pl.DataFrame) -> None:
        if frame.height == 0 and self.height:
            return
        if self._file is not None:
            raise ValueError("request rows appended after they were settled into their file")
        self._frame = None
        self.height += frame.height
        if self._stream is not None:
            self._stream.put(frame)
            return
        self._held.append(frame)
        self._held_rows += frame.height
        if self._held_rows >= self.memory_rows:
            self._start_stream()

    @property
    def spilled(self) -> bool:
        return self._stream is not None or self._file is not None

    def settle(self) -> None:
        """The last rows are in: a run that spilled closes its file (the sink's last row groups
        and footer), so that what reads its rows next (summary, write) reads them from there."""
        if self._stream is not None:
            stream, self._stream = self._stream, None
            stream.close()
            self._file = stream.path

    def _start_stream(self) -> None:
        folder = self._make_folder()
        path = folder / "requests.parquet"
        where = f"--out {self.spill_dir}" if self.spill_dir is not None else "the temp folder"
        stream = _ParquetStream(path, self._held[0].schema, self.metadata, where)
        weakref.finalize(self, _discard, stream, folder)
        self._stream = stream
        held, self._held, self._held_rows = self._held, [], 0
        for frame in held:
            stream.put(frame)

    def _make_folder(self) -> Path:
        if self.spill_dir is not None:
            from replay.outputs.rundir import writer_tag

            pid, start = writer_tag()
            out = Path(self.spill_dir)
            return Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{pid}-{start}-rows-", dir=out.resolve().parent))
        return Path(tempfile.mkdtemp(prefix="llm-replay-rows-"))

    def lazy(self) -> pl.LazyFrame:
        """Every row, lazily: the file's (settled first), or what is held."""
        self.settle()
        if self._file is not None:
            return pl.scan_parquet(self._file)
        if not self._held:
            raise ValueError("no request rows: a replay appends at least its (empty) frame")
        frames = [f.lazy() for f in self._held]
        return pl.concat(frames, how="vertical") if len(frames) > 1 else frames[0]

    def collect(self) -> pl.DataFrame:
        """Every row as one frame (a command that needs them all: tables, sweeps, calibration).
        A run that spilled reads its file back: as much memory as the frame."""
        if self._frame is None:
            if self._file is None and self._stream is None and len(self._held) == 1:
                self._frame = self._held[0]
            else:
                self._frame = self.lazy().collect()
        return self._frame

    def write(self, path: Path, metadata: dict[str, str], write_parquet) -> None:
        """requests.parquet: as one frame while held (`write_parquet`, the run's writer: the same
        file as before chunks); a spilled run's file as it is, when it was made with this
        metadata (in this order: it is the footer's), else sunk from it anew."""
        if not self.spilled:
            write_parquet(self.collect(), path, metadata)
            return
        self.settle()
        if self.metadata is not None and list(self.metadata.items()) == list(metadata.items()):
            _link_or_copy(self._file, path)
            return
        write_parquet(self.lazy(), path, metadata)


def _link_or_copy(source: Path, target: Path) -> None:
    """`target` as a hard link of `source` (beside --out, so on its file system), else a copy
    (the system's temp folder may be on another)."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def _discard(stream: _ParquetStream, folder: Path) -> None:
    stream.abort()
    shutil.rmtree(folder, ignore_errors=True)


class _Aborted(Exception):
    """The rows were dropped before their stream closed: the sink stops, the file is removed."""


class _ParquetStream:
    """One Parquet file written by polars' sink (write.py's write_parquet, in a thread) from the
    frames `put` in order, pulled from a short queue as it encodes them; `close` waits for the
    file to be whole. The sink releases the GIL while it encodes: the replay goes on meanwhile."""

    def __init__(self, path: Path, schema: pl.Schema, metadata: dict[str, str] | None, where: str):
        from polars.io.plugins import register_io_source

        from replay.outputs.write import write_parquet

        self.path, self._where = path, where  # `where`: what a failure names (--out, or the temp folder)
        self._queue: queue.Queue[pl.DataFrame | None] = queue.Queue(maxsize=QUEUED)
        self._aborted = False
        self._error: BaseException | None = None
        source = register_io_source(self._frames, schema=schema)
        self._thread = threading.Thread(target=self._run, args=(write_parquet, source, metadata or {}),
                                        name="llm-replay request rows", daemon=True)
        self._thread.start()

    def _run(self, write_parquet, source: pl.LazyFrame, metadata: dict[str, str]) -> None:
        try:
            write_parquet(source, self.path, metadata)
        except BaseException as exc:  # noqa: BLE001 - handed to the replay's thread, which raises it
            self._error = exc

    def _frames(self, with_columns, predicate, n_rows, batch_size):
        """The sink's source: the frames as they are put (a sink reads every column, unfiltered)."""
        while True:
            frame = self._queue.get()
            if self._aborted:
                raise _Aborted()
            if frame is None:
                return
            if with_columns is not None:
                frame = frame.select(with_columns)
            yield frame if predicate is None else frame.filter(predicate)

    def put(self, frame: pl.DataFrame | None) -> None:
        """Wait for room in the queue, unless the sink stopped (its error raised here)."""
        while True:
            self._raise_failure()
            try:
                self._queue.put(frame, timeout=0.2)
                return
            except queue.Full:
                continue

    def close(self) -> None:
        self.put(None)
        self._thread.join()
        self._raise_failure()

    def abort(self) -> None:
        """Stop the sink and wait for it (the rows were dropped, or the process exits): a daemon
        thread still inside polars' sink when the interpreter finalises aborts the process
        (glibc: "FATAL: exception not rethrown", exit 134 in place of 2 or 130)."""
        self._aborted = True
        while True:  # room for the end mark: the sink takes it (or a frame) and stops
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=30)

    def _raise_failure(self) -> None:
        if self._error is None and self._thread.is_alive():
            return
        if self._error is None and self._queue.empty():
            return  # finished: the end was put and taken
        error = self._error or RuntimeError("the request rows' writer stopped")
        if isinstance(error, OSError | pl.exceptions.PolarsError):
            folder = self.path.parent
            shutil.rmtree(folder, ignore_errors=True)
            raise UserError(f"{self._where}: cannot write the run's request rows to {folder}: {error}; "
                            "nothing written") from None
        raise error
