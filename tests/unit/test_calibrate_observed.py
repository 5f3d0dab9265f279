"""What an observed export pins (replay/calibration/observed.py), on hand-made series."""

from __future__ import annotations

import numpy as np

from replay.calibration.observed import Suggestion, apply, as_yaml, kv_blocks, replicas
from replay.config import FleetConfig, PoolConfig
from replay.policy_config import AutoscalerConfig

T = np.arange(10.0)


def test_a_fixed_pool_whose_observed_count_changed_gets_its_initial_count_and_a_note():
    seen = np.array([np.nan, 1, 1, 1, 3, 3, 3, 3, 2, 2])
    ran = np.full(10, 2.0)
    keys, notes = replicas(0, "chat", PoolConfig(name="chat", replicas=2), seen, ran, T)
    assert [(s.path, s.value) for s in keys] == [("pools[0].replicas", 1)]
    assert any("between 1 and 3 replicas" in n and "autoscaler" in n for n in notes)
    assert any("first changed at 4 s (1 -> 3), the replay's never did" in n for n in notes)


def test_the_timing_of_the_first_change_is_compared():
    scaler = AutoscalerConfig(policy="hpa", min_replicas=1, max_replicas=3)
    pool = PoolConfig(name="chat", replicas=1, autoscaler=scaler)
    seen = np.array([1, 1, 1, 1, 1, 1, 3, 3, 3, 3.0])
    ran = np.array([1, 1, 2, 2, 3, 3, 3, 3, 3, 3.0])
    keys, notes = replicas(0, "chat", pool, seen, ran, T)
    assert keys == []  # bounds and initial count already match
    assert notes == ["pool chat: the observed replica count first changed at 6 s (1 -> 3), the replay's at 2 s "
                     "(1 -> 2): 4 s earlier; 1 observed changes, 2 replayed"]


def test_replicas_disagreeing_on_their_blocks_give_the_smallest():
    keys, notes = kv_blocks(1, "code", (9000, 8000), 12000)
    assert [(s.path, s.value) for s in keys] == [("pools[1].engine.num_gpu_blocks_override", 8000)]
    assert notes and "8000, 9000" in notes[0]
    assert kv_blocks(1, "code", (12000,), 12000) == ([], [])


def test_keys_apply_together_and_print_as_yaml():
    cfg = FleetConfig(pools=(PoolConfig(name="a", replicas=2,
                                        autoscaler=AutoscalerConfig(policy="hpa", min_replicas=2, max_replicas=3)),))
    keys = [Suggestion(0, "replicas", 1, "x"), Suggestion(0, "autoscaler.min_replicas", 1, "y"),
            Suggestion(0, "autoscaler.max_replicas", 5, "z")]
    fixed = apply(cfg, keys)  # replicas 1 alone would be outside [2, 3]: checked once, all set
    pool = fixed.pools[0]
    assert (pool.replicas, pool.autoscaler.min_replicas, pool.autoscaler.max_replicas) == (1, 1, 5)
    assert as_yaml(keys, ["a"]) == ("pools:\n  - name: a   # pools[0]\n    replicas: 1   # x\n    autoscaler:\n"
                                    "      min_replicas: 1   # y\n      max_replicas: 5   # z\n")
