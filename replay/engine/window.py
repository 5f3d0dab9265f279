"""The numba engine's window of request slots: its `Requests` arrays hold the trace's requests
[base, base + capacity), so its memory follows the requests in flight, not the trace's length.

The kernels index slots and never see the window. Between `advance` calls the host (here, numpy)
keeps three promises the kernels rely on:

- the arrival walk never reaches a slot not yet loaded: before `advance(until)` the slots are
  loaded (a `step` at a time) past the first request the walk stops at (one that arrives after
  `until`); slots not loaded arrive never (`arrival` NO_EVENT, `gap` -1), so the walk could not
  pass them anyway;
- a closed-loop turn's successor is loaded with it (`release_next` writes its arrival): the
  window ends only where no loaded request's `next_turn` lies beyond it;
- every index a slot holds of another slot is a slot: when the oldest slots are all ended
  (finished or rejected, which nothing refers to any more), `slide` writes their output rows
  (`row_columns`, one array per column for the whole trace), moves the live slots down, and
  subtracts the shift from every stored request index (`REQUEST_LINKS`, `REPLICA_LINKS`,
  `POOL_LINKS`, the arrival cursor `Events.clock[0]`). The event buffer is drained (its request
  ids made global) before a slide, never during one.

`Requests.base[0]` is the global id of slot 0: a request's own block keys hash its global id
(kvblocks.request_key), so the KV hash table holds the same keys whatever the window.
A window the size of the trace never slides: the engine is then as it was before windows.

The trace's prefix hashes (`hashes`, the kernels' `th`): a trace read whole gives one flat array
of every request's, which the window indexes by the trace's offsets. A trace read in batches
gives each range's hashes with the range (`read`'s "hashes", its offsets into them): the window
then holds the hashes of the slots it holds, in slot order, each slot's `hash_off` into its
array; a slide drops the leaving slots' hashes (those before the first kept slot's offset) and
moves the offsets down with them. A slot's hashes are only read through its own `hash_off`, and
the block keys they make are the values', not the offsets': the same keys whatever the window.

What it cannot bound: the requests in flight. The window slides past ended requests only, in id
order, so one long-lived request (queued for long on an overloaded fleet, or a closed-loop
session spanning much of the trace) holds every later slot, and the window grows behind it
(doubling, when a slide would free less than a quarter of it): an overloaded fleet has every
request in flight, and its window becomes the trace.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from replay.engine.common import FINISHED, NO_EVENT, PENDING, REJECTED, EngineInputs, InvariantViolation
from replay.engine.state import Pools, Replicas, Requests

# Fields of a request that come from the trace: the EngineInputs attribute holding every
# request's value (None there: the value below for every request). A trace read in batches gives
# them by id range instead (`EngineInputs.requests.read(lo, hi)`, replay/fleet/streamed.py), so
# that no column of the whole trace is held.
TRACE_FIELDS = {
    "arrival": ("arrival_us", None), "prompt": ("prompt_tokens", None), "output": ("output_tokens", None),
    "priority": ("priority", None), "tenant": ("tenant", 0), "pool": ("pool", None),
    "hash_off": ("hash_off", None), "hash_len": ("hash_len", None), "adapter": ("adapter", -1),
    "hash_tokens": ("hash_tokens", "prompt_tokens"), "next_turn": ("next_turn", -1), "gap": ("turn_gap_us", -1),
}
# A slot not loaded (yet): it never arrives, and the closed-loop walk stops at it.
UNLOADED = {"arrival": NO_EVENT, "gap": -1, "next_turn": -1}
# The replay's progress of a request, as it starts: (value, dtype).
PROGRESS_FIELDS = {
    "replica": (-1, np.int64), "state": (PENDING, np.int8), "computed": (0, np.int64), "generated": (0, np.int64),
    "sched_new": (0, np.int64), "first_sched": (-1, np.int64), "first_token": (-1, np.int64),
    "finished": (-1, np.int64), "preemptions": (0, np.int64), "cached": (0, np.int64), "reject": (0, np.int8),
    "qprev": (-1, np.int64), "qnext": (-1, np.int64), "tail": (-1, np.int64), "counted_from": (0, np.int64),
    "nhit": (0, np.int64), "nblocks": (0, np.int64), "ncached": (0, np.int64), "swapped": (0, np.int64),
    "dreplica": (-1, np.int64),
    "preplica": (-1, np.int64), "pf_start": (-1, np.int64), "pf_end": (-1, np.int64),
    "xfer_start": (-1, np.int64), "xfer_done": (-1, np.int64), "xfers": (0, np.int64),
    "spec_credit": (0, np.int64), "skip_next": (-1, np.int64), "queued": (-1, np.int64), "seq": (-1, np.int64),
    "lz_join": (-1, np.int64),
}
# Every field that holds a request's slot (-1: none). Requests: the waiting-queue and held
# FIFO links, the LoRA skip links, a session's next turn. Replicas: queue and pending-FIFO ends,
# the running lists, the lazy heaps and their scratch. Pools: held FIFOs, the KV-transfer and
# session-release heaps.
REQUEST_LINKS = ("qprev", "qnext", "skip_next", "next_turn")
REPLICA_LINKS = ("wait_head", "wait_tail", "pend_head", "pend_tail", "run_list", "fh_q", "ah_q", "lz_due")
POOL_LINKS = ("held_head", "held_tail", "xh_q", "rl_q")
# Pools' heaps whose capacity follows the window's (one entry per request at most).
POOL_HEAPS = ("xh_t", "xh_q", "rl_t", "rl_q")
# The rows a request leaves the engine with: output name -> Requests field.
ROW_FIELDS = {
    "replica": "replica", "state": "state", "computed": "computed", "generated": "generated",
    "first_scheduled_us": "first_sched", "first_token_us": "first_token", "finished_us": "finished",
    "preemptions": "preemptions", "cached_tokens": "cached", "reject": "reject", "prefill_replica": "preplica",
    "prefill_end_us": "pf_end", "kv_transfer_start_us": "xfer_start", "kv_transfer_end_us": "xfer_done",
    "kv_transfers": "xfers",
}
assert set(TRACE_FIELDS) | set(PROGRESS_FIELDS) | {"base"} == set(Requests._fields)

DEFAULT_CAPACITY = 1 << 16
SCAN = 4096  # slots ended_prefix reads at a time
LOAD_STEP = 1024  # requests a fill loads at least (Window.step), unless the slots hold fewer


# The narrowest type of each output column that holds every value it can take: counts of
# replicas, preemptions, cached tokens and transfers fit int32 (the trace's token counts are
# Int32: traces/schema.py); times and the progress counts (a prompt plus its output) stay int64.
ROW_DTYPES = {"replica": np.int32, "preemptions": np.int32, "cached_tokens": np.int32,
              "prefill_replica": np.int32, "kv_transfers": np.int32}


def one_or_each(values: np.ndarray) -> np.ndarray:
    """A trace field's column of every request (TRACE_FIELDS) as int64; one that holds a single
    value (no prefix hashes, one tenant or priority: most traces) as a read-only view of it, which
    costs no memory a request. The engines only read these columns (this one: into its slots)."""
    values = np.asarray(values, np.int64)
    if len(values) and values.min() == values.max():
        return np.broadcast_to(values[:1].copy(), values.shape)
    return values


def unloaded_value(name: str) -> int:
    return UNLOADED.get(name, 0) if name in TRACE_FIELDS else PROGRESS_FIELDS[name][0]


class Window:
    """Which trace requests the engine's slots hold, and their loading and sliding."""

    def __init__(self, inputs: EngineInputs, capacity: int | None):
        self.inputs = inputs
        self.total = inputs.num_requests
        self.capacity = max(1, self.total if capacity is None else min(capacity, self.total))
        self.base = 0  # global id of slot 0
        self.loaded = 0  # slots [0, loaded) hold requests base ..
        self.ended = 0  # slots [0, ended) are known ended (finished or rejected)
        self._columns: dict[str, np.ndarray] | None = None  # row_columns
        # Rows handed over as they leave, (global id of the first, columns), instead of row_columns.
        self.sink: Callable[[int, dict[str, np.ndarray]], None] | None = None
        self._pending_from: int | None = None  # rows from here on hold their start values (columns_now)
        self._sources = {name: self._source(attr, default) for name, (attr, default) in TRACE_FIELDS.items()}
        # the prefix hashes the slots index: the whole trace's, or (read in batches) the slots'
        self.hashes = np.ascontiguousarray(inputs.trace_hashes, np.uint64) if inputs.requests is None \
            else np.zeros(0, np.uint64)
        self._hashes_held = 0  # read in batches: hashes[:_hashes_held] are the loaded slots'
        # Closed loop: the load ends E where no request before E has its next turn at E or later.
        self._ends = None
        if inputs.closed_loop:
            reach = np.maximum.accumulate(inputs.next_turn.astype(np.int64))
            self._ends = np.flatnonzero(reach < np.arange(1, self.total + 1)) + 1

    def _source(self, attr: str, default):
        value = getattr(self.inputs, attr)
        if value is None:
            return getattr(self.inputs, default) if isinstance(default, str) else default
        return value

    def requests(self, capacity: int | None = None) -> Requests:
        """`capacity` slots (default: the window's), every one unloaded; `fill` loads them."""
        n = self.capacity if capacity is None else capacity
        cols = {name: np.full(n, unloaded_value(name), np.int64) for name in TRACE_FIELDS}
        cols.update({name: np.full(n, v, dt) for name, (v, dt) in PROGRESS_FIELDS.items()})
        return Requests(base=np.full(1, self.base, np.int64), **cols)

    # --- loading -------------------------------------------------------------------------

    @property
    def end(self) -> int:
        """Global id one past the last loaded request."""
        return self.base + self.loaded

    def fill(self, rq: Requests) -> int:
        """Load the next requests into free slots: `step` of them (where the slots do not hold the
        whole trace), up to what the free slots hold (closed loop: up to a load end that keeps each
        turn's successor in); the number loaded (0: no free slot, or no load end fits)."""
        limit = min(self.total, self.base + self.capacity)
        if self._ends is not None and limit < self.total:
            i = np.searchsorted(self._ends, limit, side="right") - 1
            limit = int(self._ends[i]) if i >= 0 else 0
        if limit <= self.end:
            return 0
        end = limit if self.capacity >= self.total else min(limit, self.end + self.step)
        if self._ends is not None and end < limit:  # the first load end past the step (limit is one)
            end = int(self._ends[np.searchsorted(self._ends, end)])
        lo, hi = self.loaded, end - self.base
        if self.inputs.requests is not None:  # a trace read in batches (replay/fleet/streamed.py)
            fields = self.inputs.requests.read(self.end, end)
            hashes = fields.pop("hashes")
            for name, values in fields.items():
                getattr(rq, name)[lo:hi] = values
            self._hold_hashes(rq, lo, hi, hashes)
        else:
            g = slice(self.end, end)
            for name, src in self._sources.items():
                getattr(rq, name)[lo:hi] = src[g] if isinstance(src, np.ndarray) else src
        for name, (value, _) in PROGRESS_FIELDS.items():
            getattr(rq, name)[lo:hi] = value
        turns = rq.next_turn[lo:hi]  # global ids in the trace, slots here
        turns[turns >= 0] -= self.base
        self.loaded = hi
        return hi - lo

    @property
    def step(self) -> int:
        """Requests a fill loads at most (of a window smaller than the trace): a slide moves every
        loaded slot past the ended ones, and most of those had not arrived yet when the window was
        loaded to its end (the m-large day: ~31k of the ~32.5k slots each slide moved, 8 GB in
        all); loaded a step ahead, a slide moves the requests in flight and at most a step more."""
        return max(min(self.capacity, LOAD_STEP), self.capacity // 16)

    def _hold_hashes(self, rq: Requests, lo: int, hi: int, hashes: np.ndarray) -> None:
        """Slots [lo, hi), just loaded with offsets into `hashes`, index them after those held."""
        held = self._hashes_held
        rq.hash_off[lo:hi] += held
        need = held + len(hashes)
        if need > len(self.hashes):  # (doubling: a copy per doubling, as the slots grow)
            grown = np.zeros(max(need, 2 * len(self.hashes)), np.uint64)
            grown[:held] = self.hashes[:held]
            self.hashes = grown
        self.hashes[held:need] = hashes
        self._hashes_held = need

    def _drop_hashes(self, rq: Requests, k: int) -> None:
        """Slots [0, k) leaving (the slots not yet moved down): their hashes go, the rest move down."""
        if self.inputs.requests is None:
            return  # the whole trace's, indexed by the trace's offsets
        cut = int(rq.hash_off[k]) if k < self.loaded else self._hashes_held
        keep = self._hashes_held - cut
        self.hashes[:keep] = self.hashes[cut:self._hashes_held]
        self._hashes_held = keep
        rq.hash_off[k:self.loaded] -= cut

    def walk_stops(self, rq: Requests, cursor: int, until: int) -> bool:
        """The arrival walk, at slot `cursor`, stops at a loaded request by `until`: one that
        arrives after it (a closed-loop later turn is skipped by the walk, not waited for)."""
        if self.end == self.total:
            return True
        last = self.loaded - 1  # arrivals come nearly in id order: the last slot mostly says
        if last >= cursor and rq.arrival[last] > until and rq.gap[last] < 0:
            return True
        arrival, gap = rq.arrival[cursor:self.loaded], rq.gap[cursor:self.loaded]
        return bool(np.any((arrival > until) & (gap < 0)))

    # --- sliding -------------------------------------------------------------------------

    def ended_prefix(self, rq: Requests) -> int:
        """Slots [0, k) all ended: nothing in the engine refers to them any more."""
        if self.ended < self.loaded and rq.state[self.ended] != FINISHED and rq.state[self.ended] != REJECTED:
            return self.ended  # the oldest live request still is (most calls: one read, not a block's)
        while self.ended < self.loaded:  # in blocks: the oldest live request is mostly near
            state = rq.state[self.ended:min(self.ended + SCAN, self.loaded)]
            live = np.flatnonzero((state != FINISHED) & (state != REJECTED))
            self.ended += int(live[0]) if len(live) else len(state)
            if len(live):
                break
        return self.ended

    def row_columns(self) -> dict[str, np.ndarray]:
        """Every request's output columns, allocated once and written as requests leave: pages
        the kernel maps when first written, so they cost memory as the rows arrive."""
        if self._columns is None:
            self._columns = {name: np.empty(self.total, ROW_DTYPES.get(name, PROGRESS_FIELDS[field][1]))
                             for name, field in ROW_FIELDS.items()}
            if self.inputs.closed_loop:  # when each turn arrived (its successor's: when released)
                self._columns["arrival_us"] = np.empty(self.total, np.int64)
        return self._columns

    def write_rows(self, rq: Requests, k: int) -> None:
        """Slots [0, k)'s output columns, written to their requests' rows (or, with a `sink`,
        handed to it: copies, since the slots are then reused)."""
        if self.sink is not None:
            if k > 0:
                self.sink(self.base, {name: getattr(rq, field)[:k].astype(ROW_DTYPES.get(name, PROGRESS_FIELDS[field][1]))
                                      for name, field in ROW_FIELDS.items()})
            return
        for name, column in self.row_columns().items():
            column[self.base:self.base + k] = getattr(rq, ROW_FIELDS.get(name, "arrival"))[:k]

    def flush_rows(self, rq: Requests) -> None:
        """With a `sink`, at the end: the rows of the slots still held, then those never loaded,
        as they start (pending). Not for a closed loop, whose turns' arrivals come from the replay."""
        if self.inputs.closed_loop:
            raise InvariantViolation("a closed-loop replay's rows are read whole (columns_now), not handed over")
        self.write_rows(rq, self.loaded)
        if self.end < self.total:
            n = self.total - self.end
            self.sink(self.end, {name: np.full(n, PROGRESS_FIELDS[field][0],
                                               ROW_DTYPES.get(name, PROGRESS_FIELDS[field][1]))
                                 for name, field in ROW_FIELDS.items()})

    def columns_now(self, rq: Requests) -> dict[str, np.ndarray]:
        """Every request's output columns as of now: those that left, the window's, then those
        not loaded yet, as they start (pending; a closed-loop turn at its recorded arrival)."""
        if self.sink is not None:
            raise InvariantViolation("the window hands its rows to a sink: it keeps no columns of the whole trace")
        self.write_rows(rq, self.loaded)
        columns = self.row_columns()
        if self._pending_from is None:  # once: rows past the window are written only as they leave it
            self._pending_from = self.end
            for name, field in ROW_FIELDS.items():
                columns[name][self.end:] = PROGRESS_FIELDS[field][0]
            if self.inputs.closed_loop:
                columns["arrival_us"][self.end:] = self.inputs.arrival_us[self.end:]
        return columns

    def slide(self, rq: Requests, reps: Replicas, pools: Pools, clock: np.ndarray, k: int) -> None:
        """Drop slots [0, k) (ended), their rows written out: the rest move down by k."""
        if k <= 0:
            return
        if k > self.ended or k > clock[0]:
            raise InvariantViolation(f"window slide by {k}: only {self.ended} slots ended, cursor at {clock[0]}")
        self.write_rows(rq, k)
        self._drop_hashes(rq, k)
        keep = self.loaded - k
        for name in TRACE_FIELDS.keys() | PROGRESS_FIELDS.keys():
            a = getattr(rq, name)
            a[:keep] = a[k:self.loaded]
        # The slots let go are unloaded again: what the arrival walk reads of them (it stops at
        # them); `fill` writes every field of a slot it loads, so the rest may stay as they were.
        for name in UNLOADED:
            getattr(rq, name)[keep:self.loaded] = UNLOADED[name]
        for name in REQUEST_LINKS:
            shift_links(getattr(rq, name)[:keep], k)
        for name in REPLICA_LINKS:
            shift_links(getattr(reps, name), k)
        for name in POOL_LINKS:
            shift_links(getattr(pools, name), k)
        clock[0] -= k
        self.base += k
        self.loaded = keep
        self.ended -= k
        rq.base[0] = self.base

    def grow(self, rq: Requests, pools: Pools) -> tuple[Requests, Pools]:
        """Twice the slots (in-flight requests filled them): the arrays copied into larger ones."""
        cap = min(2 * self.capacity, self.total)
        if cap <= self.capacity:
            raise InvariantViolation(f"window of {self.capacity} slots cannot grow: it holds the whole trace")
        new = self.requests(cap)
        for name in TRACE_FIELDS.keys() | PROGRESS_FIELDS.keys():
            getattr(new, name)[:self.capacity] = getattr(rq, name)
        heaps = {}
        for name in POOL_HEAPS:
            old = getattr(pools, name)
            heaps[name] = np.zeros(max(cap, 1), old.dtype)
            heaps[name][:len(old)] = old
        self.capacity = cap
        return new, pools._replace(**heaps)


def shift_links(a: np.ndarray, k: int) -> None:
    """Slot indices in `a` down by k; a link to a dropped slot (stale: nothing reads it) is -1."""
    live = a >= k
    a[(a >= 0) & ~live] = -1
    a[live] -= k
