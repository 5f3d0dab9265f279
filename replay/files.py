"""Writing a user's output file atomically: a temp file beside it, renamed over it, so an
interrupted or failed write leaves nothing half-written; the file gets the mode a plain `open`
would give it (0666 less the umask), not the temp file's 0600.

`check_output_file` is what a command asks before it does any work: the rename would replace a
FIFO, a device node or a symlink by a regular file, or an input of the command by its output."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO

from common.errors import UserError
from common.files import kind_of

def same_file(a: os.stat_result, b: os.stat_result) -> bool:
    """One file under two names (a hard link, a symlink, a relative and an absolute path)."""
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def check_output_file(path: str | Path, *, force: bool = True, inputs: Iterable[str | Path] = (),
                      flag: str = "--out") -> None:
    """Refuse, before any work, an output path that is an input of the command, anything but a
    regular file, an existing file without `force`, or one whose directory does not exist."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise UserError(f"{flag} {path}: cannot check it ({exc.strerror})") from None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise UserError(f"{flag} {path}: is a symbolic link (to {os.readlink(path)}); expected a regular "
                            "file or a new name")
        for given in inputs:
            try:
                if same_file(st, os.stat(given)):
                    raise UserError(f"{flag} {path}: is {given}, an input of this command; choose another {flag}")
            except OSError:
                continue
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{flag} {path}: is {kind_of(st.st_mode)}, not a regular file; choose another {flag}")
        if not force:
            raise UserError(f"{flag} {path}: already exists; choose another {flag} or pass --force to replace it")
        return
    parent = path.absolute().parent
    if not parent.exists():
        raise UserError(f"{flag} {path}: directory {parent} does not exist")
    if not parent.is_dir():
        raise UserError(f"{flag} {path}: {parent} is not a directory")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomically(path: str | Path, write: Callable[[IO], None], newline: str | None = None,
                     flag: str = "--out", binary: bool = False) -> None:
    """Call `write` on a text (`binary`: bytes) handle to a temp file beside `path`, then rename
    it over `path`.
    The path is checked again here (it may have changed since the command's first check): never
    a FIFO, device or symlink replaced, never a directory created."""
    path = Path(path)
    check_output_file(path, force=True, flag=flag)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.absolute().parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise UserError(f"{flag} {path}: cannot write it ({exc.strerror})") from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with (os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", newline=newline, encoding="utf-8")) as fh:
            write(fh)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise UserError(f"{flag} {path}: cannot write it ({exc.strerror or exc})") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
