"""replay.memory.return_freed_memory gives the C heap's free pages back: a heap left full of freed
small arrays (below glibc's mmap threshold, so freed into the heap, not unmapped) shrinks."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import numpy as np
import pytest

from replay.memory import return_freed_memory


def rss_mb() -> float:
    return int(re.search(r"VmRSS:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) / 1024


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "malloc_trim") or not Path("/proc/self/status").exists(),
                    reason="glibc's malloc_trim and /proc only")
def test_freed_heap_pages_leave_the_rss():
    arrays = [np.ones(8_000) for _ in range(6_000)]  # 64 KB each, 384 MB in the heap
    last = arrays[-1]  # the heap's top stays in use: free space below it is not returned by free() alone
    del arrays
    before = rss_mb()
    return_freed_memory()
    assert rss_mb() < before - 200, (before, rss_mb())
    assert last.sum() == 8_000
