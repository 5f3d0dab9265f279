"""The tournament tree's update (replay/engine/events.py `tree_set`) against the same update with
a branch for which child wins, as it was: a fleet's step ends, the earliest replica's key moving
to its wake-up and then to the end of its next step, as advance_nb does at every step.

    python bench/bench_event_tree.py

Prints ns per update for 20 and 100 busy replicas of 160 (256 leaves), best of 3.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replay.engine.common import NO_EVENT  # noqa: E402
from replay.engine.events import tree_set  # noqa: E402

with_add = njit(_nrt=False, inline="always")(tree_set.py_func)


@njit(_nrt=False, inline="always")
def with_branch(keys, wins, base, leaves, slot, key):
    i = leaves + slot
    if keys[base + i] == key:
        return
    keys[base + i] = key
    i //= 2
    while i >= 1:
        a = base + 2 * i
        if keys[a + 1] < keys[a]:
            a += 1
        if keys[a] == keys[base + i] and wins[a] == wins[base + i]:
            return
        keys[base + i] = keys[a]
        wins[base + i] = wins[a]
        i //= 2


def stepper(update):
    @njit(_nrt=False)
    def run(keys, wins, leaves, steps):
        x = np.uint64(88172645463325252)
        total = 0
        for _ in range(steps):
            r = wins[1]
            t = keys[1] // 4
            update(keys, wins, 0, leaves, r, t * 4 + 3)  # its step ended: a wake-up at t
            x ^= x << np.uint64(13)
            x ^= x >> np.uint64(7)
            x ^= x << np.uint64(17)
            update(keys, wins, 0, leaves, r, (t + 20_000 + np.int64(x % np.uint64(20_000))) * 4)  # its next step
            total += r
        return total
    return run


def main() -> None:
    leaves, steps = 256, 2_000_000
    for busy in (20, 100):
        for name, update in (("branch", with_branch), ("add", with_add)):
            run = stepper(update)
            best = float("inf")
            for _ in range(4):  # the first compiles
                keys = np.full(2 * leaves, NO_EVENT, np.int64)
                wins = np.full(2 * leaves, -1, np.int64)
                wins[leaves:leaves + 160] = np.arange(160)
                for j in range(leaves - 1, 0, -1):
                    wins[j] = wins[2 * j]
                for r in range(busy):
                    update.py_func(keys, wins, 0, leaves, r, (r * 997 % 20_000) * 4)
                began = time.process_time()
                run(keys, wins, leaves, steps)
                best = min(best, time.process_time() - began)
            print(f"{busy:4d} busy replicas  {name:6s} {best / (2 * steps) * 1e9:5.1f} ns an update")


if __name__ == "__main__":
    main()
