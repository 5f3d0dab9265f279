"""requests.parquet as the dashboard's views read it: a query of the rows a view shows (`query`:
the worst requests at the cursor, one request's life, a workload's windows), a pass that keeps
only counts (`fold`: a replica's queue per chart column; `over` for the observed overlay's
scoring), or one column at a time when asked for (`select`), never the whole table to open a run.

A finished run's table is checked whole as it opens (tui/validate.py, in one pass a batch of
rows at a time, that holds no column), then each column is read from the file the first time it is asked for and
kept. The file is the one opened then (`RequestTable.over`), so a run replaced in place (`run
--force --out` the same directory) keeps showing the run that was opened. A live run's table is
the frames already read (`RequestTable.of_frame`).
"""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path
from typing import BinaryIO, Callable, TypeVar

import polars as pl

from common.errors import UserError

T = TypeVar("T")


class RequestTable:
    """The columns of requests.parquet, each read once, when first asked for."""

    def __init__(self, columns: list[str], height: int, path: Path | None = None, handle: BinaryIO | None = None,
                 held: dict[str, pl.Series] | None = None):
        self.columns = list(columns)
        self.height = height
        self.path = path
        self._handle = handle  # the file as opened (closed with the table)
        self._opened = _own_path(handle)
        self._bytes: bytes | None = None  # the handle's, once the path is found replaced (no _opened)
        self._held: dict[str, pl.Series] = dict(held or {})
        # (the views ask from the interface's thread and from workers; `select` reads under it)
        self._lock = threading.RLock()

    @classmethod
    def of_frame(cls, frame: pl.DataFrame) -> RequestTable:
        return cls(frame.columns, frame.height, held={name: frame[name] for name in frame.columns})

    def select(self, *names: str, keep: bool = True) -> pl.DataFrame:
        """These columns (each read from the file the first time, and kept unless not `keep`), in
        this order."""
        with self._lock:
            missing = [name for name in dict.fromkeys(names) if name not in self._held]
            if missing:
                unknown = [name for name in missing if name not in self.columns]
                if unknown:
                    raise pl.exceptions.ColumnNotFoundError(f"{unknown[0]!r} is not a column of {self.path}")
                read = self._read(missing)
                if read.height != self.height:
                    raise UserError(f"{self.path}: {read.height} rows now, {self.height} when the run was opened")
                if not keep:
                    return pl.DataFrame([self._held[name] if name in self._held else read[name] for name in names])
                self._held.update({name: read[name] for name in missing})
            return pl.DataFrame([self._held[name] for name in names])

    def query(self, plan: Callable[[pl.LazyFrame], pl.LazyFrame]) -> pl.DataFrame:
        """What `plan` makes of the table as a lazy frame, collected by polars' streaming engine:
        of a finished run's file, it reads only the columns the plan names, skips the row groups
        its filters rule out by their statistics, and holds only the rows it keeps (a batch at a
        time)."""
        return self.over(lambda table: plan(table).collect(engine="streaming"))

    def fold(self, plan: Callable[[pl.LazyFrame], pl.LazyFrame], init: Callable[[], T],
             step: Callable[[T, pl.DataFrame], T], chunk_size: int) -> T:
        """`step(so_far, batch)` over what `plan` makes of the table, from `init()`, a batch of
        `chunk_size` rows at a time: a pass that holds no column, only what `step` keeps (counts
        per chart column)."""
        def over(table: pl.LazyFrame) -> T:
            got = init()
            for batch in plan(table).collect_batches(chunk_size=chunk_size, engine="streaming"):
                got = step(got, batch)
            return got

        return self.over(over)

    def over(self, read: Callable[[pl.LazyFrame], T]) -> T:
        """`read(the table as a lazy frame)`: a live run's frames, or a finished run's file as it was
        opened, whatever has replaced the run directory since. On Linux through the handle's own
        path (/proc/self/fd/N names the inode opened), read as any path is, a page at a time; elsewhere by the
        run's path while it is still that file (checked before and after, by inode), else
        from the handle's bytes, read once and kept (polars given the open file object itself
        crashed the process now and then: a segfault in the test suite, with the interface's
        worker threads reading too; given a mapping, it copies all of it)."""
        if self.path is None:
            with self._lock:
                frame = pl.DataFrame([self._held[name] for name in self.columns])
            return read(frame.lazy())
        if self._opened is not None:
            return read(pl.scan_parquet(self._opened, glob=False))
        if self._same_file():
            got = read(pl.scan_parquet(self.path, glob=False))
            if self._same_file():
                return got
        with self._lock:
            if self._bytes is None:
                self._handle.seek(0)
                self._bytes = self._handle.read()
        return read(pl.scan_parquet(io.BytesIO(self._bytes)))

    def __getitem__(self, name: str) -> pl.Series:
        return self.select(name)[name]

    def all(self) -> pl.DataFrame:
        """Every column (what a view of whole rows, the drill-down, shows)."""
        return self.select(*self.columns)

    @property
    def held(self) -> list[str]:
        """The columns read so far."""
        return list(self._held)

    def _read(self, names: list[str]) -> pl.DataFrame:
        return self.over(lambda table: table.select(names).collect())

    def _same_file(self) -> bool:
        try:
            now, opened = os.stat(self.path), os.fstat(self._handle.fileno())
        except OSError:
            return False
        return (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino)


def _own_path(handle: BinaryIO | None) -> str | None:
    """The path that opens the same file as `handle` (Linux: /proc/self/fd/N), or None."""
    if handle is None:
        return None
    own = f"/proc/self/fd/{handle.fileno()}"
    try:
        now, opened = os.stat(own), os.fstat(handle.fileno())
    except OSError:
        return None
    return own if (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino) else None


def open_requests(file: Path, schema, opening: Callable[[pl.LazyFrame], T] | None,
                  read_whole) -> tuple[RequestTable, T | None]:
    """A finished run's requests.parquet, checked, no column read, and what `opening` (given the
    file as a lazy frame) makes of it, or None.

    Anything the streaming check doubts (or any failure on the way: an unreadable file, a
    newer schema) is left to `read_whole(file, schema)`, the reader of the whole frame, which
    raises the message it always has, or passes, and then its frame is the table."""
    from tui.validate import check_version, may_fail

    handle = open(file, "rb")  # noqa: SIM115 - kept open by the table, closed with it
    try:
        scan = pl.scan_parquet(file, glob=False)
        check_version(file, pl.read_parquet_metadata(handle))  # (a handle: glob characters are not expanded)
        if not may_fail(file, scan, schema):
            height = scan.select(pl.len()).collect().item()
            made = opening(scan) if opening is not None else None
            if os.stat(file).st_ino != os.fstat(handle.fileno()).st_ino:  # replaced meanwhile: read it whole
                raise FileNotFoundError(file)
            table = RequestTable(list(scan.collect_schema()), height, file, handle)
            handle = None
            return table, made
    except Exception:  # noqa: BLE001 - whatever it is, the whole frame's reader says it as before
        pass
    finally:
        if handle is not None:
            handle.close()
    frame = read_whole(file, schema)
    return RequestTable.of_frame(frame), opening(frame.lazy()) if opening is not None else None


def rows_in(path: Path) -> int | None:
    """A parquet file's row count from its footer (None when unreadable)."""
    try:
        return int(pl.scan_parquet(path).select(pl.len()).collect().item())
    except Exception:  # noqa: BLE001 - any unreadable file: the caller reloads in full
        return None


def columns_in(path: Path) -> list[str] | None:
    """A parquet file's column names from its footer (None when unreadable)."""
    try:
        return list(pl.read_parquet_schema(path))
    except Exception:  # noqa: BLE001 - any unreadable file: the caller reloads in full
        return None
