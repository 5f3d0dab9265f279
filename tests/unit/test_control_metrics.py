"""The control plane's scrape of a pool (replay/fleet/control.py): read from per-pool sums and
means one kernel call makes (replay/fleet/scrape.py), it is what reading each replica by id gave
before issue 15, float for float, whatever order the pool's replica ids come in."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from policies.api import Decision, PoolMetrics
from replay.engine.common import R_ACTIVE, R_DRAINING, R_OFF, R_STARTING, SNAPSHOT_COLUMNS
from replay.fleet.control import COL, FleetControl, PoolControl


def reference_scrape(slots, t, last_t, states, snap, prev, held, arrivals, prompt, output) -> PoolMetrics:
    """The scrape as control.py computed it before issue 15: every column gathered by replica id."""
    active = slots[states[slots] == R_ACTIVE]
    serving = slots[(states[slots] == R_ACTIVE) | (states[slots] == R_DRAINING)]
    dt_s = (t - last_t) / 1e6

    def rate(col):
        return float((snap[slots, COL[col]] - prev[slots, COL[col]]).sum()) / dt_s

    kv = snap[active, COL["kv_used_blocks"]] / np.maximum(snap[active, COL["kv_total_blocks"]], 1)
    busy = (snap[serving, COL["busy_us"]] - prev[serving, COL["busy_us"]]) / (t - last_t)
    lo, hi = np.searchsorted(arrivals, [last_t, t], side="right")
    n, p, o = int(hi - lo), int(prompt[lo:hi].sum(dtype=np.int64)), int(output[lo:hi].sum(dtype=np.int64))
    return PoolMetrics(
        now_us=t, replicas_active=len(active), replicas_starting=int((states[slots] == R_STARTING).sum()),
        replicas_draining=int((states[slots] == R_DRAINING).sum()),
        waiting=int(snap[slots, COL["waiting"]].sum()) + held, running=int(snap[slots, COL["running"]].sum()),
        kv_usage=float(kv.mean()) if len(kv) else 0.0,
        gpu_busy=float(np.clip(busy, 0.0, 1.0).mean()) if len(busy) else 0.0,
        arrivals_per_s=n / dt_s, prompt_tokens_per_s=rate("prefill_tokens"), output_tokens_per_s=rate("output_tokens"),
        mean_prompt_tokens=float(p) / n if n else 0.0, mean_output_tokens=float(o) / n if n else 0.0, held=held,
    )


class FakeEngine:
    """The calls FleetControl.tick makes, over fixed replica states (nothing drains or starts)."""

    def __init__(self, states, held):
        self.states, self.held = states, held

    def replica_lifecycle(self):
        return self.states.copy(), np.zeros(len(self.states), np.int64)

    def pool_counters(self):
        return {"held": self.held}

    def idle(self, r):
        return False


@st.composite
def fleets(draw):
    sizes = draw(st.lists(st.integers(0, 12), min_size=1, max_size=3))
    n = sum(sizes)
    ids = np.arange(n)
    if draw(st.booleans()):  # replica ids in any order: the gather path, not a slice
        ids = np.array(draw(st.permutations(ids.tolist())), np.int64)
    slots = np.split(ids, np.cumsum(sizes)[:-1])
    states = np.array(draw(st.lists(st.sampled_from([R_OFF, R_STARTING, R_ACTIVE, R_DRAINING]), min_size=n,
                                    max_size=n)), np.int64)
    ticks = draw(st.integers(1, 4))
    tick_us = draw(st.sampled_from([1, 250_000, 1_000_000]))
    cols = len(SNAPSHOT_COLUMNS)
    # cumulative columns grow (busy_us by up to 1.5 ticks: gpu_busy is clipped), gauges move freely
    snaps, snap = [], np.zeros((n, cols), np.int64)
    for _ in range(ticks):
        snap = snap + np.array(draw(st.lists(st.integers(0, int(1.5 * tick_us)), min_size=n * cols,
                                             max_size=n * cols)), np.int64).reshape(n, cols)
        snaps.append(snap)
    arrivals = np.sort(np.array(draw(st.lists(st.integers(0, ticks * tick_us), max_size=40)), np.int64))
    tokens = np.array(draw(st.lists(st.integers(1, 8192), min_size=len(arrivals), max_size=len(arrivals))), np.int32)
    held = np.array(draw(st.lists(st.integers(0, 5), min_size=len(sizes), max_size=len(sizes))), np.int64)
    return slots, states, tick_us, snaps, arrivals, tokens, held


@settings(max_examples=150, deadline=None)
@given(fleets())
def test_scrape_is_the_gathered_one(fleet):
    slots, states, tick_us, snaps, arrivals, tokens, held = fleet
    seen = []
    pools = [PoolControl(i, f"p{i}", s, 1, tick_us, decide=lambda ctx: seen.append(ctx.metrics) or Decision(
        ctx.desired, None), policy="recorder", max_replicas=len(states)) for i, s in enumerate(slots)]
    # every pool sees pool 0's arrivals, which are all of them, as the reference reads them
    control = FleetControl(pools, len(states), tick_us, arrivals, tokens, tokens, np.zeros(len(arrivals), np.int64),
                           {i: 0 for i in range(len(pools))})
    eng = FakeEngine(states, held)
    control.start(eng)
    membership = np.zeros((len(pools), len(states)), np.int64)
    for i, s in enumerate(slots):
        membership[i, s] = 1
    prev = np.zeros_like(snaps[0])
    for k, snap in enumerate(snaps):
        t, last_t = (k + 1) * tick_us, k * tick_us
        seen.clear()
        counts = control.tick(t, eng, snap, eng.pool_counters())
        want = [reference_scrape(s, t, last_t, states, snap, prev, int(held[i]), arrivals, tokens, tokens)
                for i, s in enumerate(slots)]
        assert [_bits(m) for m in seen] == [_bits(m) for m in want]
        assert counts.tolist() == [np.bincount(states[s], minlength=4).tolist() for s in slots]
        assert control.sums.tolist() == (membership @ snap).tolist()
        assert control.billed_gpus().tolist() == [int((states[s] != R_OFF).sum()) for s in slots]
        prev = snap


def _bits(m: PoolMetrics) -> tuple:
    """Every field, floats by their bits (so -0.0 and NaN are told apart)."""
    return tuple(np.float64(v).tobytes() if isinstance(v, float) else v for v in vars(m).values())
