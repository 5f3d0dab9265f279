"""The safety of a run directory's writer: who is writing (pid and process start time, so a reused
pid is not taken for the writer), one writer per --out (a lock beside it), the one-step swap of a
finished run into place, and the removal of what dead writers left behind.

Stdlib only: the dashboard (tui/data.py) asks `writer_alive` whether a live run's writer exited.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import re
import shutil
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from common.errors import UserError

# <linux/fcntl.h>, <linux/fs.h>: renameat2(2) with both paths relative to the working directory.
AT_FDCWD = -100
RENAME_EXCHANGE = 2
# Temp folders beside --out are named .OUT.tmp-PID-START-xxxx (a run being written, or after the
# swap the old run being deleted) and .OUT.old-PID-START-xxxx (the old run, by the two-rename
# fallback); the writer is in the name, so it survives the rename that swaps the contents.
LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)-(?P<start>\d+)-[^/]*$")


def process_start(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (starttime, clock ticks since boot), None when there is no such
    live process (a zombie is an exited one). Parsed after the last ')': the command name may
    hold spaces and parentheses (proc(5))."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    if not fields or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def writer_tag(pid: int | None = None) -> tuple[int, int]:
    """(pid, start time) of this process, or of `pid`."""
    pid = os.getpid() if pid is None else pid
    return pid, process_start(pid) or 0


def writer_alive(pid: int, start: int) -> bool:
    """Whether the process that recorded (pid, start) still runs. Without /proc (not Linux) a
    pid that answers signal 0 counts as alive."""
    if not Path("/proc/self/stat").exists():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return process_start(pid) == start


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one step: renameat2(RENAME_EXCHANGE) (Linux 3.15+). False where
    the C library or the file system has no such call (the caller then renames twice)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM as one exception; `written` is the run directory when the signal came
    after the run was already in place (main() then says so)."""

    def __init__(self, signum: int = signal.SIGINT, written: Path | None = None):
        super().__init__()
        self.signum, self.written = signum, written


# Signals raised as Interrupted since the command began. Numba compiles and loads its cache inside
# llvmlite's ctypes callbacks, which print and swallow an exception raised there: a Ctrl-C or
# SIGTERM in that second of loading would be lost and the run would go on to write its output.
_pending: list[int] = []


def raise_interrupted(signum: int, _frame) -> None:
    _pending.append(signum)
    raise Interrupted(signum)


def forget_signals() -> None:
    """A new command (main() may run many in one test process) starts with none pending."""
    _pending.clear()


def raise_if_signalled() -> None:
    """Raise the signal that arrived while its exception could be swallowed (see `_pending`);
    called where a command passes from loading or replaying to writing."""
    if _pending:
        raise Interrupted(_pending[-1])


@contextmanager
def signals_deferred() -> Iterator[list[int]]:
    """SIGINT and SIGTERM are recorded, not raised, inside the block (the swap of a run and the
    deletion of the old one must not stop half-way); the caller acts on them after it. Python
    handlers run in the main thread only; elsewhere the block runs as it is."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    previous = {s: signal.signal(s, lambda n, _f: caught.append(n)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield caught
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _lock_path(out: Path) -> Path:
    return out.parent / f".{out.name}.lock"


@contextmanager
def locked(out: Path) -> Iterator[None]:
    """Hold an exclusive flock on PARENT/.OUT.lock: a second writer of the same --out is refused.
    Parent folders made for the lock file are removed again when the command leaves them empty."""
    out = Path(os.path.abspath(out))
    made = []
    for parent in reversed([p for p in out.parents if not p.exists()]):
        try:
            parent.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:
            _remove_empty(made)
            raise UserError(f"--out {out}: cannot create {parent}: {exc.strerror}") from None
        made.append(parent)
    try:
        fd = _acquire(_lock_path(out), out)
    except BaseException:
        _remove_empty(made)
        raise
    try:
        yield
    finally:
        # Unlinked while held: a writer that opened the old file finds it gone and retries (_acquire).
        Path(_lock_path(out)).unlink(missing_ok=True)
        os.close(fd)
        _remove_empty(made)


def _acquire(path: Path, out: Path) -> int:
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            raise UserError(f"--out {out}: cannot create the lock file {path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise UserError(f"--out {out}: another llm-replay{who} is writing this run directory; wait for it "
                            "to end or choose another --out") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd
        os.close(fd)  # the holder removed the file as we opened it: lock the new one


def _remove_empty(made: list[Path]) -> None:
    for folder in reversed(made):
        try:
            folder.rmdir()
        except OSError:
            return


def live_writer(live: Path) -> tuple[int, int] | None:
    """(pid, start) recorded in DIR/live/status.json, None when it records none (an older writer)."""
    import json

    try:
        body = json.loads((live / "status.json").read_text())
        return int(body["pid"]), int(body["pid_start"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def live_is_dead(live: Path) -> bool:
    writer = live_writer(live)
    return live.is_dir() and writer is not None and not writer_alive(*writer)


def remove_leftovers(out: Path) -> None:
    """What dead writers left beside or in `out` (only those, only llm-replay's own kinds): temp
    runs are deleted; an old run the two-rename fallback moved aside is put back when `out` is
    missing (the swap never finished), else deleted; a dead `run --tui`'s live/ is deleted.
    Called with the lock on `out` held."""
    out = Path(os.path.abspath(out))
    if out.parent.is_dir():
        for entry in sorted(out.parent.iterdir()):
            m = LEFTOVER.match(entry.name)
            if not m or m["name"] != out.name or not entry.is_dir() or entry.is_symlink():
                continue
            if writer_alive(int(m["pid"]), int(m["start"])):
                continue
            if m["kind"] == "old" and (entry / "run").is_dir() and not os.path.lexists(out):
                os.rename(entry / "run", out)
            shutil.rmtree(entry, ignore_errors=True)
    if live_is_dead(out / "live"):
        shutil.rmtree(out / "live", ignore_errors=True)
