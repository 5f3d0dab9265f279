"""Run directories, written atomically: everything goes to a temp dir beside the target, then one
swap, so a reader (or the dashboard following a run) never sees a half-written run, and the old
run is either still in place or already replaced, never missing.

Contents (a contract the dashboard and outside scripts read; see README "Run outputs"):
requests.parquet, ticks.parquet, events.parquet, summary.json, config.yaml (byte-identical when
the same command runs again) and timing.json (wall seconds per phase, the one file that varies).
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import yaml

from common.errors import UserError
from replay.outputs.rundir import (Interrupted, exchange, live_is_dead, live_writer, locked, remove_leftovers,
                           signals_deferred, writer_tag)
from replay.outputs.rows import RequestRows
from replay.outputs.schema import LIVE_DIR, RUN_FILES, SCHEMA_METADATA, TIMING_FILE

# What --force may replace: a directory holding these and nothing else.
RUN_ENTRIES = (*RUN_FILES, TIMING_FILE, LIVE_DIR + "/")


@dataclass(frozen=True)
class RunOutputs:
    request_rows: RequestRows  # requests.parquet's rows, gathered in chunks (replay/outputs/rows.py)
    ticks: pl.DataFrame
    events: pl.DataFrame
    summary: dict
    config: dict
    timing: dict = field(default_factory=dict)  # phase -> wall seconds (timing.json)
    execution: str | None = None  # how the pools were replayed (replay/run.py execution), not written

    @property
    def requests(self) -> pl.DataFrame:
        """Every request's row as one frame (read back from the spilled parts of a large run)."""
        return self.request_rows.collect()

    @property
    def requests_lazy(self) -> pl.LazyFrame:
        """Every request's row, lazily: what needs a few columns of a large run reads only those."""
        return self.request_rows.lazy()


def _names(names: list[str], most: int = 5) -> str:
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def existing_out_dir(out_dir: Path) -> bool:
    """Whether an --out directory already exists; a link or a file there is refused (a run, or a
    demo's runs, go into a directory of their own, never through a link)."""
    if out_dir.is_symlink():
        raise UserError(f"--out {out_dir}: is a symbolic link (to {os.readlink(out_dir)}); give a directory")
    if not out_dir.exists():
        return False
    if not out_dir.is_dir():
        raise UserError(f"--out {out_dir}: exists and is not a directory")
    return True


def check_out_dir(out_dir: Path, force: bool, inputs: Iterable[str | Path] = ()) -> None:
    """Refuse, before any work is done, what the final swap could not do or should not do:
    --force replaces only a run directory, and never one holding an input of the command."""
    target = out_dir.resolve()
    if target == Path.cwd().resolve() or target in Path.cwd().resolve().parents:
        raise UserError(f"--out {out_dir}: is the current directory or one above it; choose a new directory")
    for parent in target.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UserError(f"--out {out_dir}: {parent} is a file, not a directory")
            break
    if not existing_out_dir(out_dir):
        return
    live = out_dir / LIVE_DIR
    writer = live_writer(live)
    if live.is_dir() and not (live / "status.json").is_file():
        # no status.json: a folder of the user's that happens to be called live/, never ours to remove
        raise UserError(f"--out {out_dir}: {live} exists and is not a live run of llm-replay; choose another --out")
    if live.is_dir() and not live_is_dead(live) and (writer is None or writer[0] != os.getpid()):
        who = f" (pid {writer[0]})" if writer else ""  # an older writer recorded no pid
        raise UserError(f"--out {out_dir}: a replay{who} is writing it ({live}); wait for it to end or "
                        "choose another --out")
    entries = sorted(p for p in out_dir.iterdir() if not (p.name == LIVE_DIR and live_is_dead(live)))
    if not entries:
        return
    if not force:
        raise UserError(f"--out {out_dir}: already exists; choose another --out or pass --force to replace it")
    held = _inputs_inside(target, inputs)
    tops = {name.split("/")[0] for name in held}
    foreign = [p.name + ("/" if p.is_dir() else "") for p in entries
               if p.name not in tops
               and not (p.name in (*RUN_FILES, TIMING_FILE) and p.is_file() and not p.is_symlink()
                        or p.name == LIVE_DIR and p.is_dir() and not p.is_symlink())]
    named = [f"{name} (an input of this command)" for name in held] + foreign
    if named:
        raise UserError(f"--out {out_dir}: holds {_names(named)}; --force replaces only a run directory "
                        f"({', '.join(RUN_ENTRIES)}) holding no input of the command; choose another --out")


def _inputs_inside(target: Path, inputs: Iterable[str | Path]) -> list[str]:
    """The names inside `target` (relative, each once) of the command's inputs: by path (a symlink
    given as the input is resolved) and by (st_dev, st_ino), so a hard link of a run's file counts."""
    held: dict[str, None] = {}
    ids = {}
    for path in inputs:
        resolved = Path(path).expanduser().resolve()
        if resolved == target or target in resolved.parents:
            held[str(resolved.relative_to(target))] = None
        try:
            st = os.stat(path)
        except OSError:
            continue
        ids[(st.st_dev, st.st_ino)] = None
    if not ids:
        return list(held)
    # What --force could delete: the top-level entries and what live/ holds (any other folder is
    # refused anyway, so a huge one is not walked). Links are not followed.
    found = list(target.iterdir())
    if (target / LIVE_DIR).is_dir() and not (target / LIVE_DIR).is_symlink():
        found += [Path(root) / name for root, dirs, files in os.walk(target / LIVE_DIR) for name in dirs + files]
    for full in found:
        try:
            st = os.lstat(full)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in ids:
            held[str(full.relative_to(target))] = None
    return list(held)


@contextmanager
def claimed(out_dir: Path, force: bool, inputs: Iterable[str | Path] = ()) -> Iterator[None]:
    """The whole of a command that writes `out_dir`: its lock (one writer at a time), what dead
    writers left there removed, then the check again (the directory may have changed since)."""
    inputs = tuple(inputs)
    with locked(out_dir):
        remove_leftovers(out_dir)
        check_out_dir(out_dir, force, inputs)
        yield


def file_metadata(summary: dict) -> dict[str, str]:
    """The Parquet files' key-value metadata, from the summary's version and hashes (or a dict
    of just those: replay_trace knows them before the rows, replay/outputs/rows.py)."""
    return {
        **SCHEMA_METADATA,
        "llm_replay.version": str(summary.get("version", "")),
        "llm_replay.config_sha256": str(summary.get("config_sha256", "")),
        "llm_replay.trace_sha256": str(summary.get("trace_sha256", "")),
    }


def _write_files(tmp: Path, run: RunOutputs) -> None:
    meta = file_metadata(run.summary)
    run.request_rows.write(tmp / "requests.parquet", meta, write_parquet)
    for name, frame in (("ticks", run.ticks), ("events", run.events)):
        write_parquet(frame, tmp / f"{name}.parquet", meta)
    (tmp / "summary.json").write_text(json.dumps(run.summary, indent=2) + "\n")
    (tmp / "config.yaml").write_text(yaml.safe_dump(run.config, sort_keys=False))


class _Recorded(io.RawIOBase):
    """A file written through Python that keeps the OSError of a failed write: polars reports
    one as a ComputeError, and the writer raises the OSError itself (ENOSPC named as such)."""

    def __init__(self, handle) -> None:
        self.handle, self.error = handle, None

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        try:
            return self.handle.write(data)
        except OSError as exc:
            self.error = exc
            raise


def write_parquet(frame: pl.DataFrame | pl.LazyFrame, path: Path, metadata: dict[str, str]) -> None:
    """`frame` to `path`, encoded and written one row group at a time (polars' writer): no
    second copy of the file in memory, so a run of millions of requests writes in little more
    than the frame's own memory. The bytes are the same as encoding the whole frame at once.
    A lazy frame (a large run's spilled request rows) is sunk: read and written a chunk at a time."""
    with open(path, "wb") as handle:
        sink = _Recorded(handle)
        try:
            if isinstance(frame, pl.LazyFrame):
                frame.sink_parquet(sink, metadata=metadata)
            else:
                frame.write_parquet(sink, metadata=metadata)
        except pl.exceptions.PolarsError:
            if sink.error is not None:
                raise sink.error from None
            raise


def write_run(out_dir: Path, run: RunOutputs, force: bool = False, timing: dict | None = None) -> Path:
    """Write `run` to a temp dir beside `out_dir`, then swap it into place. `timing` (phase ->
    seconds; default the run's own) goes to timing.json with the write's own time added."""
    began = time.perf_counter()
    out_dir = Path(out_dir)
    check_out_dir(out_dir, force)
    parent = out_dir.resolve().parent
    pid, start = writer_tag()
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-{pid}-{start}-", dir=parent))
    except OSError as exc:
        raise UserError(f"--out {out_dir}: cannot create it: {exc.strerror}") from None
    # mkdtemp makes 0o700; a run directory is shared like any other the user creates.
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o777 & ~umask)
        _write_files(tmp, run)
        timing = {**(timing or {}), **run.timing}
        timing["write_s"] = time.perf_counter() - began
        timing["wall_s"] = sum(v for k, v in timing.items() if k != "wall_s")
        (tmp / TIMING_FILE).write_text(json.dumps({k: round(v, 3) for k, v in timing.items()}, indent=2) + "\n")
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        kept = "the old run is kept" if out_dir.exists() else "nothing written"
        code = errno.errorcode.get(exc.errno or 0, "")
        raise UserError(f"--out {out_dir}: cannot write the run: {exc.strerror or exc}"
                        f"{f' ({code})' if code else ''}; {kept}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _swap_in(tmp, out_dir, parent, (pid, start))
    return out_dir


def _swap_in(tmp: Path, out_dir: Path, parent: Path, tag: tuple[int, int]) -> None:
    """The finished run in `tmp` becomes `out_dir` in one step; the old run is then deleted. A
    signal inside is acted on after it (the run is then written, and main() says so)."""
    old = None
    with signals_deferred() as caught:
        try:
            if not out_dir.exists():
                os.rename(tmp, out_dir)
            elif exchange(tmp, out_dir):
                shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the old run
            else:
                # No renameat2: two renames. Between them the old run waits in .OUT.old-PID-START-*
                # and a later start puts it back if this process died there (rundir.remove_leftovers).
                old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-{tag[0]}-{tag[1]}-", dir=parent))
                os.rename(out_dir, old / "run")
                try:
                    os.rename(tmp, out_dir)
                except OSError:
                    os.rename(old / "run", out_dir)
                    raise
                shutil.rmtree(old, ignore_errors=True)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if old is not None and not (old / "run").exists():
                old.rmdir()
            raise UserError(f"--out {out_dir}: cannot put the run in place: {exc.strerror}; "
                            f"{'the old run is kept' if out_dir.exists() else 'nothing written'}") from None
    if caught:
        raise Interrupted(caught[0], written=out_dir)
