"""Hypothesis profiles and one session-wide warm-up of the numba kernels."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

# numba compiles on the first example, so no deadline; CI is derandomized and keeps no database.
settings.register_profile(
    "ci", derandomize=True, database=None, deadline=None, max_examples=40,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(scope="session", autouse=True)
def warm_kernels():
    """Compile (or load from cache) every numba kernel once, before any test times itself."""
    from tests.strategies import tiny_inputs
    from replay.engine.numba_engine import NumbaEngine

    engine = NumbaEngine(tiny_inputs())
    engine.advance(10**12)
    assert engine.done
