"""Keys numba's on-disk cache on the kernel sources; imported first by every module with kernels."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

# Modules whose code (or constants, which numba freezes into a kernel) ends up in compiled kernels.
_KERNEL_SOURCES = ("engine_nb.py", "engine_common.py", "kvblocks.py", "stepmodel.py", "metrics.py")


def _key_numba_cache() -> None:
    """Give the numba cache a directory per version of the kernel sources.

    Numba checks a cached kernel against its own file's timestamp only. The engine's kernels
    inline functions and constants from other modules, so after an upgrade a changed
    `kvblocks.py` or `stepmodel.py` would leave a stale kernel in the cache. Runs before any
    kernel module is imported; the user's NUMBA_CACHE_DIR (else ~/.cache) is the parent.
    """
    import numba

    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for name in _KERNEL_SOURCES:
        digest.update((here / name).read_bytes())
    parent = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "llm-replay")
    numba.config.CACHE_DIR = os.path.join(parent, f"kernels-{digest.hexdigest()[:16]}")


_key_numba_cache()
