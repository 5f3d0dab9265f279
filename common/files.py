"""Open input files safely: only regular files, never a FIFO, device, socket or directory.

Opening a FIFO for reading blocks until a writer appears, and `/dev/zero` never ends, so the kind
of file is checked on a descriptor opened with O_NONBLOCK (which never blocks and, on a regular
file, changes nothing) before a single byte is read. Sizes are bounded before reading, too.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from common.errors import UserError

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link"),  # an lstat's mode
)


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words ('a FIFO (named pipe)')."""
    for test, words in _KINDS:
        if test(mode):
            return words
    return "not a regular file"


def open_regular(path: str | Path, display: str, what: str, error: type[UserError] = UserError) -> BinaryIO:
    """`path` opened for binary reading, or `error` naming `display` if it is missing, unreadable
    or anything but a regular file (`what` names the kind of file expected: 'trace', 'table')."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error(f"{display}: {what} file not found") from None
    except IsADirectoryError:
        raise error(f"{display}: is a directory (expected a {what} file)") from None
    except OSError as exc:
        raise error(f"{display}: cannot open the {what} file ({exc.strerror or exc})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = kind_of(mode)
            plain = "" if stat.S_ISDIR(mode) else ", not a regular file"
            raise error(f"{display}: is {kind}{plain} (expected a {what} file)")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def file_size(handle: BinaryIO) -> int:
    return os.fstat(handle.fileno()).st_size


def read_text_file(path: str | Path, display: str, what: str, max_bytes: int,
                   error: type[UserError] = UserError) -> bytes:
    """The bytes of a small input file (a table, a profile), refused if it is not a regular file
    or is larger than `max_bytes`; never reads more than its size at opening, plus one byte."""
    with open_regular(path, display, what, error) as handle:
        size = file_size(handle)
        if size > max_bytes:
            raise error(f"{display}: {size:,} bytes, more than the {max_bytes:,} a {what} file may hold")
        data = handle.read(size + 1)
    if len(data) > max_bytes:  # grew while being read
        raise error(f"{display}: more than the {max_bytes:,} bytes a {what} file may hold")
    return data
