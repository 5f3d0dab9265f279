"""A run's request rows (requests.parquet's), gathered chunk by chunk as requests leave the replay,
so that a day of tens of millions of requests never stands as one frame in memory.

Chunks are held in memory while they are few (`MEMORY_ROWS`: every run of the bundled traces, and
its rows stay one frame, as before); past that, what is held is written out as one Parquet part to
a spill folder, and the rows are then a lazy scan of the parts (and of what is still held). The
run's requests.parquet is that scan sunk into one file, one row group at a time; what a summary
needs (a few columns at a time) is read from the same scan.

The spill folder is made beside the run directory with write_run's temp prefix
(`.<out>.tmp-<pid>-<start>-`), so a replay that is killed leaves nothing that the next run on the
same --out does not remove (replay/outputs/rundir.py remove_leftovers); without one it is made in
the system's temp folder. Either way it is removed when the rows are (or at exit).
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from pathlib import Path

import polars as pl

from common.errors import UserError

MEMORY_ROWS = 1 << 20  # rows held in memory before they are written out as one part


class RequestRows:
    """The run's request rows in id order: `append` chunks in order; `lazy`, `collect`, `write`."""

    def __init__(self, spill_dir: Path | None = None, memory_rows: int | None = None):
        self.spill_dir = spill_dir  # where a folder of parts is made, when one is needed
        self.memory_rows = max(1, MEMORY_ROWS if memory_rows is None else memory_rows)
        self.height = 0
        self._held: list[pl.DataFrame] = []
        self._held_rows = 0
        self._parts: list[Path] = []
        self._folder: Path | None = None
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
        self._frame = None
        self._held.append(frame)
        self._held_rows += frame.height
        self.height += frame.height
        if self._held_rows >= self.memory_rows:
            self._write_part()

    @property
    def spilled(self) -> bool:
        return bool(self._parts)

    def settle(self) -> None:
        """The last rows are in: a run that spilled writes out what it still holds too, so that
        what reads its rows next (summary, write) holds none of them in memory meanwhile."""
        if self._parts and self._held:
            self._write_part()

    def _write_part(self) -> None:
        if self._folder is None:
            self._folder = self._make_folder()
        part = self._folder / f"{len(self._parts):05d}.parquet"
        # Parts are read back once or twice: fast to write and to read beats small.
        try:
            pl.concat(self._held, rechunk=False).write_parquet(part, compression="lz4", statistics=True)
        except (OSError, pl.exceptions.PolarsError) as exc:
            shutil.rmtree(self._folder, ignore_errors=True)
            where = f"--out {self.spill_dir}" if self.spill_dir is not None else "the temp folder"
            raise UserError(f"{where}: cannot write the run's request rows to {self._folder}: {exc}; "
                            "nothing written") from None
        self._parts.append(part)
        self._held, self._held_rows = [], 0

    def _make_folder(self) -> Path:
        if self.spill_dir is not None:
            from replay.outputs.rundir import writer_tag

            pid, start = writer_tag()
            out = Path(self.spill_dir)
            folder = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{pid}-{start}-rows-", dir=out.resolve().parent))
        else:
            folder = Path(tempfile.mkdtemp(prefix="llm-replay-rows-"))
        weakref.finalize(self, shutil.rmtree, str(folder), True)
        return folder

    def lazy(self) -> pl.LazyFrame:
        """Every row, lazily: the parts scanned, then what is held."""
        frames = ([pl.scan_parquet(self._parts)] if self._parts else []) + [f.lazy() for f in self._held]
        if not frames:
            raise ValueError("no request rows: a replay appends at least its (empty) frame")
        return pl.concat(frames, how="vertical") if len(frames) > 1 else frames[0]

    def collect(self) -> pl.DataFrame:
        """Every row as one frame (a command that needs them all: tables, sweeps, calibration).
        A run that spilled reads its parts back: as much memory as the frame."""
        if self._frame is None:
            if not self._parts and len(self._held) == 1:
                self._frame = self._held[0]
            else:
                self._frame = self.lazy().collect()
        return self._frame

    def write(self, path: Path, metadata: dict[str, str], write_parquet) -> None:
        """requests.parquet: as one frame while held (`write_parquet`, the run's writer: the same
        file as before chunks), else the parts streamed into it one row group at a time."""
        if not self._parts:
            write_parquet(self.collect(), path, metadata)
            return
        write_parquet(self.lazy(), path, metadata)
