"""requests.parquet as the dashboard's views read it: one column at a time, when a view first
asks for it, never the whole table to open a run.

A finished run's table is checked whole as it opens (tui/validate.py, in one streaming pass that
holds no column), then each column is read from the file the first time it is asked for and
kept. The file is read through the descriptor opened then, so a run replaced in place (`run
--force --out` the same directory) keeps showing the run that was opened. A live run's table is
the frames already read (`RequestTable.of_frame`).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import polars as pl

from common.errors import UserError


class RequestTable:
    """The columns of requests.parquet, each read once, when first asked for."""

    def __init__(self, columns: list[str], height: int, path: Path | None = None, fd: int | None = None,
                 held: dict[str, pl.Series] | None = None):
        self.columns = list(columns)
        self.height = height
        self.path = path
        self._fd = fd
        self._held: dict[str, pl.Series] = dict(held or {})
        self._lock = threading.Lock()  # (the views ask from the interface's thread and from workers)

    @classmethod
    def of_frame(cls, frame: pl.DataFrame) -> RequestTable:
        return cls(frame.columns, frame.height, held={name: frame[name] for name in frame.columns})

    def __del__(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def select(self, *names: str) -> pl.DataFrame:
        """These columns (each read from the file the first time), in this order."""
        with self._lock:
            missing = [name for name in dict.fromkeys(names) if name not in self._held]
            if missing:
                unknown = [name for name in missing if name not in self.columns]
                if unknown:
                    raise pl.exceptions.ColumnNotFoundError(f"{unknown[0]!r} is not a column of {self.path}")
                read = pl.read_parquet(self._source(), columns=missing, glob=False)
                if read.height != self.height:
                    raise UserError(f"{self.path}: {read.height} rows now, {self.height} when the run was opened")
                self._held.update({name: read[name] for name in missing})
            return pl.DataFrame([self._held[name] for name in names])

    def __getitem__(self, name: str) -> pl.Series:
        return self.select(name)[name]

    def all(self) -> pl.DataFrame:
        """Every column (what a view of whole rows, the drill-down, shows)."""
        return self.select(*self.columns)

    @property
    def held(self) -> list[str]:
        """The columns read so far."""
        return list(self._held)

    def _source(self) -> str | Path:
        # the file as it was opened, even if the run directory was replaced since (Linux: the
        # descriptor's /proc entry reopens the same inode)
        proc = f"/proc/self/fd/{self._fd}"
        return proc if self._fd is not None and os.path.exists(proc) else self.path


def open_requests(file: Path, schema, opening: tuple[str, ...], read_whole) -> RequestTable:
    """A finished run's requests.parquet, checked, with only the `opening` columns read.

    Anything the streaming check doubts (or any failure on the way: an unreadable file, a
    newer schema) is left to `read_whole(file, schema)`, the reader of the whole frame, which
    raises the message it always has, or passes, and then its frame is the table."""
    from tui.validate import check_version, may_fail

    fd = os.open(file, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    proc = f"/proc/self/fd/{fd}"
    source = proc if os.path.exists(proc) else file  # checked and read: the one file opened here
    try:
        scan = pl.scan_parquet(source, glob=False)
        with open(source, "rb") as handle:  # (by handle: a name with glob characters is not expanded)
            check_version(file, pl.read_parquet_metadata(handle))
        if not may_fail(file, scan, schema):
            held = scan.select(opening).collect()
            table = RequestTable(list(scan.collect_schema()), held.height, file, fd,
                                 {name: held[name] for name in held.columns})
            fd = None
            return table
    except Exception:  # noqa: BLE001 - whatever it is, the whole frame's reader says it as before
        pass
    finally:
        if fd is not None:
            os.close(fd)
    return RequestTable.of_frame(read_whole(file, schema))


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
