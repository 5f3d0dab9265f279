"""Writing a user's output file atomically: a temp file beside it, renamed over it, so an
interrupted or failed write leaves nothing half-written; the file gets the mode a plain `open`
would give it (0666 less the umask), not the temp file's 0600."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomically(path: str | Path, write: Callable[[IO[str]], None], newline: str | None = None) -> None:
    """Create `path`'s directory, call `write` on a text handle to a temp file there, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w", newline=newline, encoding="utf-8") as fh:
            write(fh)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
