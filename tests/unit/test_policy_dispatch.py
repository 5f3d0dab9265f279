"""The registry-built dispatch: each id calls its kernel, an id without one returns the marker,
and an engine kernel that calls it is loaded from numba's cache by a second process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from policies._dispatch import UnknownPolicyId, build_reference

TOY = {
    "toy/__init__.py": "",
    "toy/a.py": "from numba import njit\n@njit(cache=True)\ndef kernel(x, k):\n    return x + k\n",
    "toy/b.py": "from numba import njit\n@njit(cache=True)\ndef kernel(x, k):\n    return x * k\n",
    "toy/engine.py": textwrap.dedent("""
        from numba import njit
        from policies._dispatch import build_dispatch
        from toy import a, b
        dispatch = build_dispatch([a.kernel, b.kernel], -1)
        @njit(cache=True)
        def step(pid, x, k):
            return dispatch(pid, x, k)
    """),
    "run.py": textwrap.dedent("""
        from toy.engine import step
        print(step(0, 5, 3), step(1, 5, 3), step(2, 5, 3), sum(step.stats.cache_hits.values()))
    """),
}


def test_dispatch_calls_by_id_and_an_engine_kernel_caches(tmp_path: Path):
    for name, text in TOY.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(Path(__file__).resolve().parents[2])]))

    def run() -> list[str]:
        done = subprocess.run([sys.executable, "run.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                              check=True)
        return done.stdout.split()

    assert run() == ["8", "15", "-1", "0"]  # compiled; id 2 has no kernel
    assert run() == ["8", "15", "-1", "1"]  # a second process loads `step` from the cache


def test_reference_dispatch_raises_for_an_id_without_a_policy():
    dispatch = build_reference([lambda x: x + 1, lambda x: x * 2], "queue order")
    assert dispatch(1, 4) == 8
    with pytest.raises(UnknownPolicyId, match="queue order id 2 has no policy"):
        dispatch(2, 4)
    with pytest.raises(UnknownPolicyId):
        dispatch(-1, 4)
